"""Faults, bad input and untrusted files: nothing lost, nothing half-written published, nobody surprised.

Each case of docs/faults.md is here: a build killed mid-way (parent or java child), two writers on one
output, a full disk while writing shards and manifests, damaged or hostile manifests and shards, and bad
corpus records through the CLI. Real components throughout: the embedded model, the real writers, a real
`java` indexer; faults are injected with signals, flock, RLIMIT_FSIZE (the kernel's own EFBIG) and ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from procs import alive, children, wait_dead

from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import atomic_write_bytes, exclusive_lock
from lsr_index.vectors import shards
from lsr_index.vectors.manifest import MANIFEST, Manifest
from lsr_index.vectors.quantize import SparseVectors
from lsr_index.vectors.shards import ShardWriter, read_shard, verify_shards

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "corpus.jsonl"
LSR = [sys.executable, "-m", "lsr_index", "--quiet"]
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


# --- shared set-up -----------------------------------------------------------------------------------

def synthetic_vectors(out: Path, docs: int, terms: int = 20, max_impact: int = 60, shard_docs: int = 5000,
                      fmt: str = "jsonl") -> Manifest:
    """A complete vectors directory made by the real ShardWriter and Manifest, without a model. Indexing
    cost grows with docs × terms × impact: Anserini repeats each term `impact` times."""
    rng = np.random.default_rng(7)
    vocab = [f"t{i}" for i in range(2000)]

    def shard(start: int, n: int):
        chosen = np.sort((rng.integers(0, len(vocab), (n, 1)) + np.arange(terms) * 61) % len(vocab), axis=1)
        yield [f"d{start + i}" for i in range(n)], SparseVectors(
            np.arange(n + 1, dtype=np.int64) * terms, chosen.astype(np.int32).ravel(),
            rng.integers(1, max_impact, n * terms, dtype=np.int32))

    return shards.write_vectors(out, vocab, (shard(s, min(shard_docs, docs - s)) for s in range(0, docs, shard_docs)),
                                 fmt, encoder={"doc_max_length": 32, "query_max_length": 16})


def encode(source: Path, out: Path, fmt: str = "jsonl.gz", **options) -> Manifest:
    options = {"doc_max_length": 32, "shard_docs": 20, "progress": False, "output_format": fmt, **options}
    return encode_corpus(EncodeJob(inputs=(str(source),), options=EncodeOptions(**options)), out)


def vectors_of(directory: Path) -> list[tuple[str, dict[str, int]]]:
    return [r for s in Manifest.load(directory).shards for r in read_shard(directory / s.file)]


def leftovers(directory: Path) -> list[str]:
    """Temporary or work files anywhere below `directory` (lock files are expected and harmless)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(".*") if not p.name.endswith(".lock"))


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Any write past `limit` bytes into one file fails with EFBIG, the kernel's own error, as a full disk
    fails it with ENOSPC (SIGXFSZ, which would kill the process instead, is ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def full_disk_open(free: int):
    """An `open` whose files share `free` bytes: the write that crosses it writes what fits, then ENOSPC."""
    left = [free]

    class Full(io.FileIO):
        def write(self, data) -> int:
            data = bytes(data)
            if len(data) > left[0]:
                super().write(data[:left[0]])
                left[0] = 0
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
            left[0] -= len(data)
            return super().write(data)

    def fake_open(file, mode="r", *args, **kwargs):
        if "w" not in mode:
            return open(file, mode, *args, **kwargs)
        return Full(file if isinstance(file, int) else os.fspath(file), "w")

    return fake_open


def _java_child(pid: int) -> int | None:
    for child in children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                return child
    return None


def _start_build(vectors: Path, index: Path) -> tuple[subprocess.Popen, int, Path]:
    """`lsr-index build` in a process of its own, returned once java is writing the index."""
    proc = subprocess.Popen([*LSR, "build", "--vectors", str(vectors), "--index", str(index), "--heap", "1g",
                             "--builder", "anserini"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    work = index.parent / f".{index.name}.building-{proc.pid}"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        java = _java_child(proc.pid)
        if java and (work / "index").is_dir():
            time.sleep(0.3)
            assert proc.poll() is None and alive(java), "the build ended before it could be interrupted"
            return proc, java, work
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the build did not start indexing: {proc.communicate()}")


# --- 1. build killed mid-way -------------------------------------------------------------------------

@pytest.mark.lucene
def test_build_killed_midway_publishes_nothing_and_a_rerun_succeeds(splade_tiny, tmp_path):
    """SIGKILL the build's Python process, then its java child, then interrupt it; each time no index appears
    and the java indexer does not outlive the build; the next build cleans up and indexes every document.
    While a build runs, a second build of the same index and an encode into its vectors are refused."""
    vectors, index = tmp_path / "vectors", tmp_path / "index"
    manifest = synthetic_vectors(vectors, docs=40_000, terms=30, shard_docs=10_000)  # java still busy when killed
    before = (vectors / MANIFEST).read_bytes()
    from lsr_index.engines.lucene.build import build_index

    # SIGKILL the parent: it can clean nothing up, but java must die with it (PR_SET_PDEATHSIG)
    proc, java, work = _start_build(vectors, index)
    try:
        with pytest.raises(LsrIndexError, match="in use by another lsr-index process"):
            build_index(vectors, index, progress=False)
        with pytest.raises(LsrIndexError, match="in use by another lsr-index process"):
            encode(SAMPLE, vectors, "jsonl", overwrite=True)
        assert (vectors / MANIFEST).read_bytes() == before
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_dead(java, 2), "the java indexer outlived its SIGKILLed parent"
        assert "documents indexed" not in (work / "build.log").read_text()  # killed, not finished
    finally:
        if alive(java):
            os.kill(java, signal.SIGKILL)
    assert not index.exists() and work.exists()  # only the hidden work directory is left, never published
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["vectors"]

    # SIGKILL the java child: the build fails cleanly, removes its work and the stale one
    proc, java, work2 = _start_build(vectors, index)
    os.kill(java, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith(("note:", "error:"))]
    assert lines[0].startswith(f"note: removed {work}, the work directory of an earlier build")
    assert lines[1].startswith("error: Lucene indexing failed (killed by signal SIGKILL); nothing was published")
    assert not index.exists() and not work.exists() and not work2.exists()

    # Ctrl-C in a process that lives on (library use): the build stops java itself before cleaning up. The interrupt
    # is sent once java has started (a watcher thread sees it), not after a fixed delay that a fast or a busy
    # machine would place before java starts or after it ends
    running, stop = [], threading.Event()

    def interrupt(signum, frame):
        running.append(_java_child(os.getpid()))
        raise KeyboardInterrupt

    def interrupt_once_java_runs() -> None:
        while not stop.is_set() and _java_child(os.getpid()) is None:
            time.sleep(0.01)
        if not stop.is_set():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, interrupt)
    watcher = threading.Thread(target=interrupt_once_java_runs, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            build_index(vectors, index, heap="1g", progress=False, builder="anserini")
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGALRM, previous)
    assert running[0] is not None, "the interrupt came when java was not running"
    assert not alive(running[0]) and not index.exists() and leftovers(tmp_path) == []

    done = subprocess.run([*LSR, "build", "--vectors", str(vectors), "--index", str(index), "--heap", "1g",
                           "--builder", "anserini"], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    info = json.loads((index / "lsr-index.json").read_text())
    assert info["documents"] == manifest.docs == 40_000
    assert leftovers(tmp_path) == [] and (vectors / MANIFEST).read_bytes() == before


# --- 2. two writers on one output --------------------------------------------------------------------

def test_a_second_encode_on_the_same_output_is_refused(splade_tiny, tmp_path):
    out = tmp_path / "vectors"
    with exclusive_lock(out):  # another encode holds it
        done = subprocess.run([*LSR, "encode", str(SAMPLE), "-o", str(out)], capture_output=True, text=True,
                              env=ENV, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {out} is in use by another lsr-index process (it holds {out / '.lock'}); wait for it to "
        "finish or stop it, then rerun"]
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written


def test_a_build_is_refused_while_its_vectors_or_index_are_being_written(tmp_path):
    from lsr_index.engines.lucene.build import build_index

    vectors, index = tmp_path / "vectors", tmp_path / "index"
    synthetic_vectors(vectors, docs=12, shard_docs=5)
    with exclusive_lock(vectors), pytest.raises(LsrIndexError, match="vectors is being written by another"):
        build_index(vectors, index, progress=False)  # an encode is (re)writing the shards
    with exclusive_lock(tmp_path, name=".index.lock"), \
            pytest.raises(LsrIndexError, match="in use by another lsr-index process"):
        build_index(vectors, index, progress=False)  # another build of the same index
    with exclusive_lock(vectors, shared=True), exclusive_lock(vectors, shared=True):
        pass  # readers share
    assert not index.exists() and leftovers(tmp_path) == []


# --- 3. disk full ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ramp(tmp_path_factory) -> Path:
    """120 documents growing from 1 word to ~30, so each 20-document shard is larger than the one before:
    a per-file size limit then fails exactly one chosen shard."""
    path = tmp_path_factory.mktemp("ramp") / "ramp.jsonl"
    docs = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:120]]
    path.write_text("".join(json.dumps({"id": d["id"], "text": " ".join((d["title"] + " " + d["text"]).split()
                                                                        [:1 + i // 4])}) + "\n"
                            for i, d in enumerate(docs)))
    return path


@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_disk_full_mid_encode_loses_nothing_and_rerun_equals_uninterrupted(splade_tiny, ramp, tmp_path, fmt):
    whole = encode(ramp, tmp_path / "whole", fmt)
    sizes = [(tmp_path / "whole" / s.file).stat().st_size for s in whole.shards]
    assert len(sizes) == 6 and sizes == sorted(set(sizes))
    floor = (tmp_path / "whole" / MANIFEST).stat().st_size + 256  # manifests always fit: shards fail
    limits = [(a + b) // 2 for a, b in zip([0, *sizes], sizes) if (a + b) // 2 > floor][::2]
    out, faults = tmp_path / "faulty", 0
    for limit in limits:  # each run resumes what the last one kept, and fails at a later shard
        failing = next(k for k, size in enumerate(sizes) if size > limit)
        with file_size_limit(limit), pytest.raises(LsrIndexError) as caught:
            encode(ramp, out, fmt)
        faults += 1
        message = str(caught.value)
        # the chunk file of the failing shard that was being written, named with its place
        assert re.search(rf"\.part-{failing:05d}\.\d+\.{re.escape(fmt)}\b.*File too large \[EFBIG\]", message), message
        assert "rerun the same command" in message
        kept = Manifest.load(out)
        assert not kept.complete and [s.sha256 for s in kept.shards] == [s.sha256 for s in whole.shards[:failing]]
        verify_shards(out, kept)
        assert leftovers(out) == [] and not (out / "shards" / f"part-{failing:05d}.{fmt}").exists()
    assert faults >= 2
    resumed = encode(ramp, out, fmt)
    assert resumed.complete and [s.sha256 for s in resumed.shards] == [s.sha256 for s in whole.shards]
    assert vectors_of(out) == vectors_of(tmp_path / "whole") and len(vectors_of(out)) == 120  # nothing lost


def test_disk_full_through_the_cli_is_one_clear_line(splade_tiny, ramp, tmp_path):
    out = tmp_path / "vectors"
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4000, resource.getrlimit(resource.RLIMIT_FSIZE)[1])); "
            "from lsr_index.cli import main; main()")
    args = ["--quiet", "encode", str(ramp), "-o", str(out), "--doc-max-length", "32", "--shard-docs", "20"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    # the chunk file of the shard being written when the limit was reached
    assert re.match(rf"error: {re.escape(str(out / 'shards'))}/\.part-\d{{5}}\.\d+\.jsonl\b.*File too large \[EFBIG\]",
                    line), line
    kept = Manifest.load(out)
    assert not kept.complete and 0 < len(kept.shards) < 6
    verify_shards(out, kept)
    assert leftovers(out) == []
    resumed = encode(ramp, out)  # the same settings as the command: it resumes (equality: the test above)
    assert resumed.stats.resumed_at == kept.docs and resumed.docs == 120 and len(vectors_of(out)) == 120


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz"])
def test_shard_writer_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch, fmt):
    """ENOSPC at every stage of a shard's life (open, first batch, second batch, final flush)."""
    vocab = np.array([f"t{i}" for i in range(300)], dtype=object)
    rng = np.random.default_rng(3)
    batches = [([f"d{b}-{i}" for i in range(40)],
                SparseVectors(np.arange(41, dtype=np.int64) * 30,
                              np.sort(rng.choice(300, (40, 30)), axis=1).astype(np.int32).ravel(),
                              rng.integers(1, 500, 1200, dtype=np.int32))) for b in range(2)]
    path = tmp_path / f"part-00000.{fmt}"

    def write_shard() -> None:
        writer = ShardWriter(path, fmt, vocab)
        for ids, vectors in batches:
            writer.add(ids, vectors)
        writer.finish()

    write_shard()
    size = path.stat().st_size
    path.unlink()
    for free in sorted({0, 1, size // 3, size // 2, size - 20, size - 1}):
        monkeypatch.setattr(shards, "open", full_disk_open(free), raising=False)
        with pytest.raises(LsrIndexError, match=rf"{path.name}: cannot write the shard: No space left on device "
                                                 r"\[ENOSPC\]; the partial shard was removed"):
            write_shard()
        assert sorted(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_shard()
    assert path.stat().st_size == size


def test_a_failed_fsync_publishes_nothing(tmp_path, monkeypatch):
    def broken_fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    path = tmp_path / "part-00000.parquet"
    writer = ShardWriter(path, "parquet", np.array(["a", "b"], dtype=object))
    writer.add(["d"], SparseVectors(np.array([0, 1]), np.array([1], np.int32), np.array([5], np.int32)))
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(LsrIndexError, match=r"part-00000.parquet: cannot write the shard: .*\[EIO\]"):
        writer.finish()
    writer.abort()  # what the caller does next: harmless twice
    assert sorted(tmp_path.iterdir()) == []


def test_a_manifest_that_cannot_be_saved_keeps_the_old_one(tmp_path, monkeypatch):
    manifest = synthetic_vectors(tmp_path / "v", docs=6, shard_docs=3)
    before = (tmp_path / "v" / MANIFEST).read_bytes()
    manifest.complete = False

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(LsrIndexError, match=r"manifest.json: cannot write: No space left on device \[ENOSPC\] "
                                             r"\(free some space and rerun\)"):
        manifest.save(tmp_path / "v")
    monkeypatch.undo()
    with file_size_limit(len(before) // 2), pytest.raises(LsrIndexError, match=r"File too large \[EFBIG\]"):
        manifest.save(tmp_path / "v")  # the kernel's own error, part-way through the write
    assert (tmp_path / "v" / MANIFEST).read_bytes() == before and leftovers(tmp_path) == []
    atomic_write_bytes(tmp_path / "v" / "other.json", b"{}")  # readable like any file the user creates
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "v" / "other.json").stat().st_mode & 0o777 == 0o666 & ~umask


# --- 4. damaged or hostile vectors directories -------------------------------------------------------

def _edit_manifest(change):
    def damage(vectors: Path) -> None:
        body = json.loads((vectors / MANIFEST).read_text())
        change(body)
        (vectors / MANIFEST).write_text(json.dumps(body))
    return damage


def _truncate(vectors: Path) -> None:
    shard = vectors / "shards" / "part-00001.jsonl"
    shard.write_bytes(shard.read_bytes()[:-50])


def _flip(vectors: Path) -> None:
    shard = vectors / "shards" / "part-00001.jsonl"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))


def _escape(body: dict) -> None:
    body["shards"][1]["file"] = "../secret.jsonl"


DAMAGE = {
    "truncated shard": (_truncate, "checksum mismatch"),
    "one bit flipped": (_flip, "checksum mismatch"),
    "shard missing": (lambda v: (v / "shards" / "part-00002.jsonl").unlink(), "part-00002.jsonl: shard listed in "
                      "the manifest is missing"),
    "path ../escape": (_edit_manifest(_escape), r"shard path '../secret.jsonl' is not a relative path inside"),
    "absolute path": (_edit_manifest(lambda b: b["shards"][0].update(file="/etc/hostname")),
                      "shard path '/etc/hostname' is not a relative path inside"),
    "malformed JSON": (lambda v: (v / MANIFEST).write_bytes((v / MANIFEST).read_bytes()[:-40]),
                       r"manifest.json: unreadable manifest \(not valid JSON"),
    "not UTF-8": (lambda v: (v / MANIFEST).write_bytes(b"\xff\xfe{}"), "unreadable manifest"),
    "shards not a list": (_edit_manifest(lambda b: b.update(shards={"file": "x"})), "'shards' must be a list"),
    "shard field missing": (_edit_manifest(lambda b: b["shards"][0].pop("sha256")), "'sha256' must be a str"),
    "negative count": (_edit_manifest(lambda b: b["shards"][0].update(docs=-5)), "'docs' must be a non-negative"),
    "checksum not hex": (_edit_manifest(lambda b: b["shards"][0].update(sha256="z" * 64)), "not a sha256 hex"),
    "shard listed twice": (_edit_manifest(lambda b: b["shards"].append(b["shards"][0])), "listed twice"),
    "gap in shards": (_edit_manifest(lambda b: b["shards"].pop(1)), r"do not cover documents 4\.\.7"),
    "model field missing": (_edit_manifest(lambda b: b["model"].pop("sha256")), "'model.sha256' is missing"),
    "not a manifest": (_edit_manifest(lambda b: b.update(kind="something else")), "not an lsr-index vectors"),
    "incomplete": (_edit_manifest(lambda b: b.update(complete=False)), "the encoding is incomplete"),
    "manifest is a directory": (lambda v: ((v / MANIFEST).unlink(), (v / MANIFEST).mkdir()),
                                "cannot read the manifest"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_build_refuses_a_damaged_or_hostile_vectors_directory(tmp_path, case):
    from lsr_index.engines.lucene.build import build_index

    vectors = tmp_path / "vectors"
    synthetic_vectors(vectors, docs=12, shard_docs=4)
    (tmp_path / "secret.jsonl").write_text('{"id": "stolen", "contents": "", "vector": {"x": 1}}\n')
    damage, message = DAMAGE[case]
    damage(vectors)
    with pytest.raises(LsrIndexError, match=message):
        build_index(vectors, tmp_path / "index", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.jsonl", "vectors"]  # nothing indexed


def test_a_malformed_manifest_is_one_line_through_the_cli(tmp_path):
    vectors = tmp_path / "vectors"
    synthetic_vectors(vectors, docs=12, shard_docs=4)
    (vectors / MANIFEST).write_text('{"kind": "lsr-index/vectors", "shards": [')
    done = subprocess.run([*LSR, "build", "--vectors", str(vectors), "--index", str(tmp_path / "index")],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {vectors / MANIFEST}: unreadable manifest (not valid JSON")
    assert not (tmp_path / "index").exists()


def test_search_refuses_a_damaged_index_record(tmp_path):
    from lsr_index.engines.index import index_record

    index = tmp_path / "index"
    index.mkdir()
    for text, message in [("{", "not valid JSON"), ("[]", "not an lsr-index index record"),
                          ('{"kind": "lsr-index/index", "vectors_manifest": {"kind": "lsr-index/vectors", '
                           '"version": 2, "shards": [{"file": "../x", "start": 0, "docs": 1, "nonzeros": 1, '
                           '"sha256": "' + "0" * 64 + '", "input": "' + "0" * 32 + '"}], "output_format": "jsonl", '
                           '"model": {"name": "m", "sha256": "s"}, "encoder": {"doc_max_length": 8, '
                           '"query_max_length": 8, "dtype": "float32", "backend": "auto"}, "shard_docs": 1, '
                           '"quantization": {"scale": 100}, "input": {}}}', "not a relative path inside")]:
        (index / "lsr-index.json").write_text(text)
        with pytest.raises(LsrIndexError, match=message):
            index_record(index)


def test_publishing_over_an_old_index_swaps_in_one_step(tmp_path):
    from lsr_index.engines.publish import publish as _publish

    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "old").touch()
    work = tmp_path / ".index.building-1"
    (work / "index").mkdir(parents=True)
    (work / "index" / "new").touch()
    _publish(work / "index", tmp_path / "index", work)
    assert [p.name for p in (tmp_path / "index").iterdir()] == ["new"]
    assert list(tmp_path.rglob("old")) == []  # swapped out, then deleted: no search held it


# --- 5. bad records through the CLI ------------------------------------------------------------------

BAD = {  # line number (1-based) → (the line, the id reported, a fragment of the reason)
    3: ("{not json", None, "malformed JSON"),
    8: ('{"title": "t", "text": "no id here"}', None, "no id field"),
    15: ('{"id": "empty-text", "text": ""}', "empty-text", "empty text"),
    20: (None, None, "duplicate id"),  # the first good record again
}


@pytest.fixture(scope="module")
def bad_corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """24 good sample records with the BAD lines at their line numbers; returns the path and the good ids."""
    good = SAMPLE.read_text().splitlines()[:24]
    lines = iter(good)
    text = [(BAD[n][0] or good[0]) if n in BAD else next(lines) for n in range(1, len(good) + len(BAD) + 1)]
    path = tmp_path_factory.mktemp("bad") / "corpus.jsonl"
    path.write_text("\n".join(text) + "\n")
    return path, [json.loads(line)["id"] for line in good]


@pytest.fixture(scope="module")
def cli_runs(splade_tiny, bad_corpus, tmp_path_factory):
    """`encode --on-error skip` and `--on-error fail` on the bad corpus."""
    path, _ = bad_corpus
    work = tmp_path_factory.mktemp("cli")
    common = ["--doc-max-length", "32", "--shard-docs", "10", "--format", "jsonl"]
    done = {mode: run_cli("--quiet", "encode", str(path), "-o", str(work / mode), "--on-error", mode, *common)
            for mode in ("skip", "fail")}
    return {mode: (run.returncode, run.stderr, work / mode) for mode, run in done.items()}


def test_on_error_skip_lists_every_skipped_record(bad_corpus, cli_runs):
    path, ids = bad_corpus
    returncode, stderr, out = cli_runs["skip"]
    assert returncode == 0, stderr
    assert f"skipped {len(BAD)} bad record(s): see {out / 'skipped.jsonl'}" in stderr
    report = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    duplicate_id = json.loads(SAMPLE.read_text().splitlines()[0])["id"]
    assert len(report) == len(BAD)
    for entry, (number, (_, doc_id, reason)) in zip(report, BAD.items()):
        # the report's keys: file/line/id (documented) or path/where/doc_id (corpus.Skipped's own names)
        got = [entry.get(a, entry.get(b)) for a, b in (("file", "path"), ("line", "where"), ("id", "doc_id"))]
        assert got == [str(path), number, duplicate_id if number == 20 else doc_id], entry
        assert reason in entry["reason"]
    manifest = Manifest.load(out)
    assert manifest.complete and manifest.skipped == len(BAD) and manifest.docs == len(ids) == 24
    assert [doc for doc, _ in vectors_of(out)] == ids


def test_skipped_report_uses_the_documented_keys(cli_runs):
    _, _, out = cli_runs["skip"]
    first = json.loads((out / "skipped.jsonl").read_text().splitlines()[0])
    assert sorted(first) == ["file", "id", "line", "reason"]


def test_on_error_fail_stops_at_the_first_bad_line(bad_corpus, cli_runs):
    path, _ = bad_corpus
    returncode, stderr, out = cli_runs["fail"]
    assert returncode == 1 and "Traceback" not in stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"error: {path}:3: malformed JSON") and "skip" in line
    assert not Manifest.load(out).complete
