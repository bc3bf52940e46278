"""Encode stage: ownership of what it deletes and writes, validated settings, O(1) manifest updates per shard,
resuming after a fixed or changed input, checkpoints inside a shard, truncation reported."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import pytest
from cli_runner import kept_line, run_cli
from procs import alive
from transformers import AutoTokenizer

from lsr_index.encode import plan as encode_module
from lsr_index.encode.job import EncodeJob, EncodeOptions, input_digest
from lsr_index.encode.run import encode_corpus
from lsr_index.errors import LsrIndexError
from lsr_index.inputs.corpus import CorpusReader
from lsr_index.vectors.manifest import Manifest
from lsr_index.vectors.quantize import Quantization
from lsr_index.vectors.shards import read_shard

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"
ROOT = Path(__file__).resolve().parents[1]


def encode(source: Path, out: Path, **options) -> Manifest:
    options = {"doc_max_length": 32, "shard_docs": 64, "progress": False, "output_format": "jsonl", **options}
    return encode_corpus(EncodeJob(inputs=(str(source),), options=EncodeOptions(**options)), out)


def vectors_of(directory: Path) -> list:
    return [r for s in Manifest.load(directory).shards for r in read_shard(directory / s.file)]


def sample_lines(n: int | None = None) -> list[str]:
    return SAMPLE.read_text().splitlines()[:n]


# --- class 1: a command deletes and writes only what it owns ------------------------------------------

def test_a_symlinked_shards_directory_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "part-00000.jsonl").write_text("precious\n")
    out = tmp_path / "v"
    out.mkdir()
    (out / "manifest.json").write_text("{damaged")
    (out / "shards").symlink_to(victim)
    with pytest.raises(LsrIndexError, match="symbolic link"):
        encode(SAMPLE, out, overwrite=True)
    assert sorted(p.name for p in victim.iterdir()) == ["part-00000.jsonl"]
    assert (victim / "part-00000.jsonl").read_text() == "precious\n"


def test_a_symlinked_manifest_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    out = tmp_path / "v"
    out.mkdir()
    (out / "manifest.json").symlink_to(elsewhere)
    with pytest.raises(LsrIndexError, match="symbolic link"):
        encode(SAMPLE, out, overwrite=True)
    assert elsewhere.read_text() == "{}"


def test_overwrite_never_deletes_or_writes_among_the_inputs(tmp_path):
    corpus_dir = tmp_path / "corpus_dir"
    (corpus_dir / "shards").mkdir(parents=True)
    inside = corpus_dir / "shards" / "part-00000.jsonl"  # an input with a shard's name, where shards go
    inside.write_text("\n".join(sample_lines(30)) + "\n")
    (corpus_dir / "manifest.json").write_text("{damaged")
    with pytest.raises(LsrIndexError, match="inside the output directory"):
        encode(inside, corpus_dir, overwrite=True)
    assert inside.read_text().count("\n") == 30
    plain = corpus_dir / "x.jsonl"
    plain.write_text("\n".join(sample_lines(30)) + "\n")
    cli = run_cli("--quiet", "encode", str(plain), "-o", str(corpus_dir), "--overwrite")
    assert cli.returncode == 1 and "inside the output directory" in cli.stderr and "Traceback" not in cli.stderr
    assert plain.read_text().count("\n") == 30 and inside.read_text().count("\n") == 30


def test_overwrite_does_not_write_into_a_foreign_directory(tmp_path):
    out = tmp_path / "mine"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "part-00000.jsonl").write_text("someone else's\n")
    with pytest.raises(LsrIndexError, match="not an lsr-index output"):
        encode(SAMPLE, out, overwrite=True)
    assert (out / "shards" / "part-00000.jsonl").read_text() == "someone else's\n"
    assert not (out / "manifest.json").exists() and not (out / ".lock").exists()


@pytest.mark.parametrize("manifest", ['{"name": "x"}', "[1, 2]", "{damaged", None])
def test_overwrite_refuses_a_directory_whose_manifest_is_not_an_encodes(tmp_path, manifest):
    """A manifest.json that is not lsr-index's must not let --overwrite replace it, delete a file named like a shard
    and write beside the user's data: the directory is refused, and left without even a lock file."""
    out = tmp_path / "theirs"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "part-00000.jsonl").write_text("keep\n")
    (out / "data.csv").write_text("a,b\n")
    if manifest is not None:
        (out / "manifest.json").write_text(manifest)
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    for overwrite in (False, True):
        with pytest.raises(LsrIndexError, match=f"{out} exists and is not an lsr-index output"):
            encode(SAMPLE, out, overwrite=overwrite)
        assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before


def test_a_link_loop_among_the_inputs_is_named_not_a_traceback(tmp_path):
    """Excluding the output resolves every input entry before the usual checks: a link loop there must be the usual
    one-line refusal, not a RuntimeError traceback."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("\n".join(sample_lines(5)) + "\n")
    (corpus / "loop.jsonl").symlink_to("loop.jsonl")
    for source in (corpus, f"{corpus}/*.jsonl"):
        cli = run_cli("--quiet", "encode", str(source), "-o", str(tmp_path / "v"))
        assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
        assert f"{corpus / 'loop.jsonl'}: cannot read" in cli.stderr and "symbolic links" in cli.stderr


def test_an_output_made_inside_the_corpus_directory_is_not_read_back(tmp_path):
    """`cd corpus && lsr-index encode .` makes ./lsr-out among the corpus files: read back, it would fail the rerun
    ("subdirectories of a corpus directory are not searched"), and a pattern such as dir/**/*.json would read the
    output's manifest.json as input (bad records, skipped without a word under --on-error skip)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.json").write_text("\n".join(sample_lines(40)) + "\n")
    first = encode(corpus, corpus / "lsr-out" / "vectors")
    with pytest.raises(LsrIndexError, match="already holds a complete encoding"):
        encode(corpus, corpus / "lsr-out" / "vectors")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.json").write_text("\n".join(sample_lines(40)) + "\n")
    job = EncodeJob(inputs=(f"{tree}/**/*.json",), on_error="skip", options=EncodeOptions(
        doc_max_length=32, shard_docs=64, progress=False, output_format="jsonl"))
    pattern = encode_corpus(job, tree / "vectors")
    with pytest.raises(LsrIndexError, match="already holds a complete encoding"):  # not 'skipped 52 bad records'
        encode_corpus(job, tree / "vectors")
    assert first.docs == pattern.docs == 40 and pattern.skipped == 0
    cli = run_cli("--quiet", "encode", str(corpus), "-o", str(corpus / "lsr-out" / "vectors"))
    assert f"note: passed over 1 entry of the input directories (the output, names starting with '.' or '_'): " \
        f"{corpus / 'lsr-out'}" in cli.stderr and "already holds a complete encoding" in cli.stderr


# --- class 6: every setting validated where it is built, whatever its source ---------------------------

@pytest.mark.parametrize("options", [{"shard_docs": 0}, {"doc_max_length": "64"}, {"doc_max_length": 1},
                                     {"query_max_length": 9000}, {"max_tokens": 8}, {"output_format": "csv"},
                                     {"backend": "cuda"}, {"checkpoint_seconds": -1}, {"shard_docs": True}])
def test_encode_options_refuse_bad_values(options):
    with pytest.raises(LsrIndexError, match=next(iter(options))):
        EncodeOptions(**options)


@pytest.mark.parametrize("values", [{"scale": -100}, {"scale": 0}, {"scale": math.nan}, {"scale": math.inf},
                                    {"top_k": -1}, {"top_k": 0}, {"top_k": 2.5}, {"min_weight": -0.1},
                                    {"min_weight": math.nan}])
def test_quantization_refuses_bad_values(values):
    with pytest.raises(LsrIndexError, match=next(iter(values))):
        Quantization(**values)


def test_a_preset_that_is_not_utf8_is_one_clear_line(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_bytes(b"scale = 1\xff\n")
    run = run_cli("--quiet", "encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--preset", str(preset))
    assert run.returncode == 1 and run.stderr.startswith(f"error: preset {preset}: cannot read it: 'utf-8' codec")
    assert "Traceback" not in run.stderr


def test_a_preset_with_zero_shard_docs_is_one_clear_line(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text("shard_docs = 0\n")
    run = run_cli("--quiet", "encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--preset", str(preset))
    assert run.returncode == 1 and "shard_docs must be an integer ≥ 1" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def _manifest_body(**changes) -> dict:
    body = {"kind": "lsr-index/vectors", "version": 2, "model": {"name": "m", "sha256": "0" * 64},
            "encoder": {"doc_max_length": 32, "query_max_length": 16, "dtype": "float32", "backend": "auto"},
            "quantization": {"scale": 100.0, "top_k": None, "min_weight": 0.0}, "input": {},
            "output_format": "jsonl", "shard_docs": 10, "shards": []}
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            body[section] = {**body[section], field: value}
        else:
            body[section] = value
    return body


@pytest.mark.parametrize("changes", [{"quantization__scale": -100}, {"quantization__top_k": -1},
                                     {"quantization__scale": "100"}, {"encoder__doc_max_length": "64"},
                                     {"encoder__query_max_length": 0}, {"shard_docs": 0}, {"output_format": "csv"},
                                     {"encoder__dtype": "int8"}, {"quantization__extra": 1}])
def test_a_hostile_manifest_cannot_pass(changes):
    Manifest.from_dict(_manifest_body(), "m.json")  # the unchanged body is valid
    with pytest.raises(LsrIndexError, match="malformed manifest"):
        Manifest.from_dict(_manifest_body(**changes), "m.json")


def test_an_older_manifest_says_what_to_do():
    with pytest.raises(LsrIndexError, match=r"format version 1.*--overwrite"):
        Manifest.from_dict(_manifest_body(version=1), "m.json")


# --- class 7: publishing is O(1) per shard; the advised fix after a bad record works --------------------

def test_one_document_shards_do_not_rewrite_the_manifest_per_shard(tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(sample_lines(300)) + "\n")
    saves = []
    real_save = Manifest.save
    monkeypatch.setattr(Manifest, "save", lambda self, d: (saves.append(time.monotonic()), real_save(self, d)))
    t0 = time.monotonic()
    manifest = encode(corpus, tmp_path / "v", shard_docs=1, doc_max_length=16)
    assert len(manifest.shards) == 300 and manifest.complete
    # a save at the start and the end, and at most one a second in between (not one per shard)
    assert len(saves) <= 3 + (time.monotonic() - t0) / encode_module.SAVE_EVERY, len(saves)


def test_saves_from_the_writer_thread_and_the_driver_never_interleave(tmp_path, monkeypatch):
    """Shards are recorded by the writer thread while the driver's progress flushes: with every flush due and a
    slow save, no two saves may overlap, and no save may start while the manifest on disk lists a deleted file."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"passage {i} on topic {i % 37}"}) + "\n"
                              for i in range(1200)))
    out, overlaps, missing, inside = tmp_path / "v", [], [], threading.Semaphore(1)
    real_save = Manifest.save

    def slow_save(self, directory):
        if not inside.acquire(blocking=False):
            overlaps.append(len(self.shards))
        on_disk = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
        listed = [p["file"] for p in on_disk.get("shards", []) + on_disk.get("chunks", [])]
        missing.extend(f for f in listed if not (out / f).exists())
        time.sleep(0.03)
        real_save(self, directory)
        inside.release()

    monkeypatch.setattr(Manifest, "save", slow_save)
    monkeypatch.setattr(encode_module, "SAVE_EVERY", 0.0)
    # shards of 3 pieces (256 + 256 + 88 documents), each checkpointed: chunks are recorded, then replaced
    manifest = encode(corpus, out, shard_docs=600, max_tokens=256, checkpoint_seconds=0, doc_max_length=8)
    assert manifest.complete and manifest.docs == 1200 and not manifest.chunks
    assert not overlaps and not missing, (overlaps[:5], missing[:5])


def test_fixing_a_bad_record_keeps_the_shards_before_it_and_a_changed_one_is_reencoded(tmp_path):
    lines = sample_lines()
    corpus = tmp_path / "c.jsonl"
    broken = list(lines)
    broken[299] = '{"id": "broken"}'
    corpus.write_text("\n".join(broken) + "\n")
    with pytest.raises(LsrIndexError, match=r"c\.jsonl:300"):
        encode(corpus, tmp_path / "v", max_tokens=4096)
    kept = Manifest.load(tmp_path / "v")
    assert kept.docs == 256  # the first batch (max_tokens / 16 = 256 documents): shards 0..3
    fixed = list(lines)
    record = json.loads(fixed[10])
    record["text"] = "an edited document in the first shard"
    fixed[10] = json.dumps(record)
    corpus.write_text("\n".join(fixed) + "\n")
    done = encode(corpus, tmp_path / "v", max_tokens=4096)
    assert done.complete and done.docs == 400
    # shard 0 (documents 0..63) changed and is encoded again, shards 1..3 are kept, 4..6 are new
    assert done.stats.stale_parts_reencoded == 1 and done.stats.docs_this_run == 64 + 144
    reader = CorpusReader([str(corpus)], batch_size=1000, max_chars=32 * 100)
    batch = next(iter(reader))
    ids, texts = batch.column("id").to_pylist(), batch.column("text").to_pylist()
    assert all(int(s.input, 16) == input_digest(s.start, ids[s.start:s.end], texts[s.start:s.end])
               for s in done.shards)


def _broken_at_300(corpus: Path) -> list[str]:
    lines = sample_lines()
    corpus.write_text("\n".join([*lines[:299], '{"id": "broken"}', *lines[300:]]) + "\n")
    return lines


def test_a_recorded_shard_lost_or_damaged_since_is_encoded_again(tmp_path):
    """A resume checks the recorded parts' files as well as their input: checked on input alone, a deleted shard
    would stay listed and the run end "complete" over the gap."""
    corpus = tmp_path / "c.jsonl"
    lines = _broken_at_300(corpus)
    with pytest.raises(LsrIndexError, match=r"c\.jsonl:300"):
        encode(corpus, tmp_path / "v", max_tokens=4096)
    shards = Manifest.load(tmp_path / "v").shards
    assert len(shards) == 4
    (tmp_path / "v" / shards[1].file).unlink()
    damaged = tmp_path / "v" / shards[2].file
    damaged.write_bytes(damaged.read_bytes()[:-10])
    corpus.write_text("\n".join(lines) + "\n")
    done = encode(corpus, tmp_path / "v", max_tokens=4096)
    assert done.complete and done.stats.stale_parts_reencoded == 2 and done.stats.docs_this_run == 400 - 128
    reference = tmp_path / "whole.jsonl"
    reference.write_text("\n".join(lines) + "\n")
    whole = encode(reference, tmp_path / "w", max_tokens=4096)
    assert [s.sha256 for s in done.shards] == [s.sha256 for s in whole.shards]


def test_a_damaged_checkpoint_is_encoded_again_from_where_it_starts(tmp_path):
    """Recorded chunks are checked before they are joined into the shard: joined unchecked, a half chunk would make
    a "complete" shard that decompresses only in part."""
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps({**json.loads(line), "id": f"{k}-{n}"}) for k in range(2) for n, line in
             enumerate(sample_lines())]  # 800: two pieces of 256 encoded (and checkpointed) before the bad record
    corpus.write_text("\n".join([*lines[:699], '{"id": "broken"}', *lines[700:]]) + "\n")
    with pytest.raises(LsrIndexError, match=r"c\.jsonl:700"):
        encode(corpus, tmp_path / "v", max_tokens=4096, shard_docs=1000, checkpoint_seconds=0,
               output_format="jsonl.gz")
    chunks = sorted(Manifest.load(tmp_path / "v").chunks, key=lambda c: c.start)
    assert len(chunks) >= 3
    damaged = tmp_path / "v" / chunks[1].file
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    corpus.write_text("\n".join(lines) + "\n")
    done = encode(corpus, tmp_path / "v", max_tokens=4096, shard_docs=1000, checkpoint_seconds=0,
                  output_format="jsonl.gz")
    assert done.complete and done.stats.resumed_at == sum(c.docs for c in chunks) - chunks[1].docs
    assert done.stats.stale_parts_reencoded == 1  # the chunks after it are independent of it: kept
    encode(corpus, tmp_path / "w", max_tokens=4096, shard_docs=1000, output_format="jsonl.gz")
    assert vectors_of(tmp_path / "v") == vectors_of(tmp_path / "w")


def test_a_run_stopped_at_a_bad_record_resumes_under_on_error_skip(tmp_path):
    """The error says "rerun with --on-error skip"; that rerun keeps the shards encoded before the bad record, rather
    than refusing them as made from other input and asking for --overwrite, which would discard them."""
    corpus = tmp_path / "c.jsonl"
    _broken_at_300(corpus)
    with pytest.raises(LsrIndexError, match=r"c\.jsonl:300.*--on-error skip"):
        encode(corpus, tmp_path / "v", max_tokens=4096)
    job = EncodeJob(inputs=(str(corpus),), on_error="skip", options=EncodeOptions(
        doc_max_length=32, shard_docs=64, progress=False, output_format="jsonl", max_tokens=4096))
    done = encode_corpus(job, tmp_path / "v")
    assert done.complete and done.stats.resumed_at == 256 and done.docs == 399 and done.skipped == 1
    assert done.input.on_error == "skip"


# --- truncation reported; text past what the tokenizer keeps is not held whole ---------------

def test_truncated_documents_are_counted_and_the_longest_measured(tmp_path, splade_tiny):
    records = [json.loads(line) for line in sample_lines(40)]
    records.append({"id": "huge", "text": "word " * 20_000})  # 100,000 characters, cut at 64 × 100
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = encode(corpus, tmp_path / "v", doc_max_length=64, shard_docs=16)
    tokenizer = AutoTokenizer.from_pretrained(splade_tiny.path)
    lengths = [len(tokenizer(r["text"][:64 * 100])["input_ids"]) for r in records]
    assert asdict(manifest.truncation) == {"documents": sum(n > 64 for n in lengths),
                                           "share": round(sum(n > 64 for n in lengths) / len(records), 6),
                                           "longest_tokens": max(lengths), "cut_at_characters": 1}
    assert json.loads((tmp_path / "v" / "manifest.json").read_text())["truncation"] == asdict(manifest.truncation)


# --- a checkpoint inside a shard; a kill loses at most the piece in progress ------------------

def encode_checkpointed(corpus: Path, out: Path, fmt: str, checkpoint: float) -> Manifest:
    """The kill test's runs, in this process or in DRIVER's: one shard (the default shard_docs) in pieces of up to
    256 documents, checkpointed at the first piece end past `checkpoint` seconds."""
    return encode(corpus, out, output_format=fmt, checkpoint_seconds=checkpoint, max_tokens=4096,
                  shard_docs=EncodeOptions().shard_docs)


DRIVER = textwrap.dedent(f"""
    import sys
    from pathlib import Path
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from test_encode_robustness import encode_checkpointed
    encode_checkpointed(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
""")


def _run(corpus: Path, out: Path, fmt: str, checkpoint: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(corpus), str(out), fmt, str(checkpoint)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _chunks_recorded(out: Path) -> int:
    try:
        return len(json.loads((out / "manifest.json").read_text())["chunks"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "sig"), [("jsonl.gz", signal.SIGKILL), ("parquet", signal.SIGINT)])
def test_a_kill_inside_a_shard_keeps_its_checkpoints_and_resumes_byte_identical(tmp_path, fmt, sig):
    lines = sample_lines()
    copies = 4  # 1,600 documents: one shard (default shard_docs), 10 pieces of up to 256; long enough on an idle
    corpus = tmp_path / "c.jsonl"  # machine to outlast the manifest's once-a-second saves
    corpus.write_text("".join(json.dumps({**json.loads(line), "id": f"{k}-" + json.loads(line)["id"]}) + "\n"
                              for k in range(copies) for line in lines))
    total = copies * len(lines)
    reference = encode_checkpointed(corpus, tmp_path / "whole", fmt, 30.0)
    out = tmp_path / "killed"
    proc = _run(corpus, out, fmt, 0.0)  # a checkpoint at every piece end
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and _chunks_recorded(out) < 2:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.kill(proc.pid, sig)
    proc.wait()
    at_kill = Manifest.load(out)
    checkpointed = sum(c.docs for c in at_kill.chunks)
    assert not at_kill.shards and len(at_kill.chunks) >= 2 and checkpointed >= 80
    resumed = encode_checkpointed(corpus, out, fmt, 0.0)  # the rerun, in this process
    assert (resumed.stats.docs_this_run, resumed.stats.resumed_at) == (total - checkpointed, checkpointed)
    assert [(s.docs, s.nonzeros, s.input) for s in resumed.shards] == \
        [(s.docs, s.nonzeros, s.input) for s in reference.shards]
    assert vectors_of(out) == vectors_of(tmp_path / "whole")
    if fmt == "jsonl.gz":  # the same gzip members, concatenated: the same bytes
        assert [s.sha256 for s in resumed.shards] == [s.sha256 for s in reference.shards]
    assert not resumed.chunks and not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".")]


def test_serializer_processes_write_the_bytes_the_writer_thread_writes(tmp_path, seed, monkeypatch):
    """On GPU runs pieces are serialized in a process pool, block by block; the shard must not change by a byte,
    and its blocks (one gzip member each) are the same wherever they were made."""
    import numpy as np
    import pyarrow as pa

    from lsr_index.encode.job import Piece, PieceStats
    from lsr_index.encode.plan import publish_shard
    from lsr_index.encode.sink import ChunkSink
    from lsr_index.vectors import shards
    from lsr_index.vectors.quantize import SparseVectors
    from lsr_index.vectors.serializers import SerializerPool

    monkeypatch.setattr(shards, "SERIALIZE_DOCS", 5)  # pieces of 7, 1 and 12 documents: 2 + 1 + 3 blocks
    rng = np.random.default_rng(seed)
    vocab = np.array([f"t{i}" for i in range(497)] + ["über", "日本", "##ß"], dtype=object)
    chunks = []
    for n in (7, 1, 12):
        lengths = rng.integers(0, 30, n)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        terms = np.concatenate([np.sort(rng.choice(500, k, replace=False)) for k in lengths]).astype(np.int32)
        chunks.append(([f"doc {len(chunks)}-{i}" for i in range(n)],
                       SparseVectors(indptr, terms, rng.integers(1, 300, int(indptr[-1])).astype(np.int32))))
    shas = []
    # the same pool serves two shards in turn, as it serves a cluster's encoder shard after shard
    pool = SerializerPool(2, vocab.tolist())
    for name, serializers in (("thread", 0), ("pool", 2), ("pool again", 2)):
        out = tmp_path / name
        (out / "shards").mkdir(parents=True)
        published = []
        job = EncodeJob(inputs=("unused",), options=EncodeOptions(shard_docs=20, output_format="jsonl.gz"))
        sink = ChunkSink(out, job, vocab, published.append, pool if serializers else None, serializers)
        start = 0
        for ids, vectors in chunks:
            rows = pa.record_batch([pa.array(ids)], names=["id"])
            sink.put(Piece(0, start, rows), ids, vectors, PieceStats(), time.monotonic())
            start += len(ids)
        sink.close()
        assert [s.docs for s in published] == [20]
        shard = publish_shard(out, 0, published, "jsonl.gz", 0)  # one chunk: it becomes the shard
        shas.append(shard.sha256)
        data, members = (out / shard.file).read_bytes(), 0
        while data:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            inflate.decompress(data)
            data, members = inflate.unused_data, members + 1
        assert members == 6
        assert [doc for doc, _ in read_shard(out / shard.file)] == [d for ids, _ in chunks for d in ids]
    pool.close()
    assert shas[0] == shas[1] == shas[2]


def test_cpu_encoding_reuses_its_large_blocks_instead_of_faulting_them_in(tmp_path):
    """CPU encoding frees and reallocates blocks of tens of MB per batch (the body's activations): served by mmap, every
    block would fault in fresh pages, and system time would be a large share of a CPU encode. A second encode in the
    same process, once the blocks exist, must fault in far fewer pages than the ~30 per token that mmap'd blocks cost:
    at most 8, not 0 (a thread that lands in a fresh malloc arena faults its blocks in once). Counted in a fresh
    process: the faults of a process that ran other tests first are not this encoder's."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(sample_lines(128)) + "\n")
    code = f"""
import resource, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_encode_robustness import encode
from pathlib import Path
encode(Path({str(corpus)!r}), Path({str(tmp_path / "first")!r}), doc_max_length=128, shard_docs=128)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
manifest = encode(Path({str(corpus)!r}), Path({str(tmp_path / "second")!r}), doc_max_length=128, shard_docs=128)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, manifest.stats.tokens_per_second
      * manifest.stats.seconds)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    faults, tokens = map(float, done.stdout.split()[-2:])
    assert faults < 8 * tokens, (faults, tokens)


def test_a_serializer_that_dies_fails_its_work_with_one_line_instead_of_hanging():
    """A serializer process killed (OOM killer, a crash): what it was asked fails, and what is asked later goes to
    the live processes, or fails at once when none is left; nothing waits forever for an answer."""
    import numpy as np

    from lsr_index.vectors.quantize import SparseVectors
    from lsr_index.vectors.serializers import SerializerPool
    from lsr_index.vectors.shards import json_vector_line

    one = SparseVectors(np.array([0, 1]), np.array([1], np.int32), np.array([5], np.int32))
    pool = SerializerPool(2, ["a", "b"])
    try:
        assert pool.submit(["x"], one, "jsonl").result(timeout=60) == json_vector_line("x", {"b": 5})
        pool._children[0].process.kill()
        pool._children[0].process.wait()
        deadline = time.time() + 30
        while 0 not in pool._ended and time.time() < deadline:
            time.sleep(0.05)
        assert "ended unexpectedly (exit code -9)" in pool._ended[0]
        assert [pool.submit(["y"], one, "jsonl").result(timeout=60) for _ in range(3)] == \
            [json_vector_line("y", {"b": 5})] * 3
        pool._children[1].process.kill()
        with pytest.raises(LsrIndexError, match="serializer process ended unexpectedly"):
            pool.submit(["z"], one, "jsonl").result(timeout=60)
            pool.submit(["z"], one, "jsonl").result(timeout=60)
    finally:
        pool.close()


@pytest.mark.slow
def test_work_that_cannot_be_sent_fails_alone_and_a_stopped_serializer_does_not_hang_close():
    """A request that does not pickle fails its own future with one line, and the process goes on answering the
    next ones in order. A stopped process (SIGSTOP) with a large request half written: close() still returns."""
    import numpy as np

    from lsr_index.vectors.quantize import SparseVectors
    from lsr_index.vectors.serializers import SerializerPool
    from lsr_index.vectors.shards import json_vector_line

    one = SparseVectors(np.array([0, 1]), np.array([1], np.int32), np.array([5], np.int32))
    pool = SerializerPool(1, ["a", "b"])
    try:
        bad = pool.submit([lambda: 0], one, "jsonl")
        good = [pool.submit([f"d{i}"], one, "jsonl") for i in range(3)]
        with pytest.raises(LsrIndexError, match=r"cannot hand a serializer process its work: .*pickle"):
            bad.result(timeout=60)
        assert [f.result(timeout=60) for f in good] == [json_vector_line(f"d{i}", {"b": 5}) for i in range(3)]
        pool._children[0].process.send_signal(signal.SIGSTOP)
        n = 300_000
        big = SparseVectors(np.arange(n + 1), np.ones(n, np.int32), np.ones(n, np.int32))
        stuck = pool.submit([f"d{i}" for i in range(n)], big, "jsonl")
        time.sleep(0.5)
        closed = threading.Thread(target=pool.close)
        closed.start()
        closed.join(60)
        assert not closed.is_alive(), "close() hung on a stopped serializer"
        with pytest.raises(LsrIndexError, match="ended unexpectedly"):
            stuck.result(timeout=60)
    finally:
        pool.close()


SERIALIZERS_PARENT = textwrap.dedent("""
    import time
    from lsr_index.vectors.quantize import SparseVectors
    from lsr_index.vectors.serializers import SerializerPool
    from lsr_index.vectors.shards import json_vector_line
    import numpy as np
    pool = SerializerPool(2, [f"t{i}" for i in range(30000)])
    one = SparseVectors(np.array([0, 1]), np.array([7], np.int32), np.array([3], np.int32))
    assert pool.submit(["d"], one, "jsonl").result() == json_vector_line("d", {"t7": 3})
    print(*[child.process.pid for child in pool._children], flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_serializers_end_with_a_killed_parent(tmp_path):
    """SIGKILL of the process that owns a serializer pool: its processes end (orphans would wait forever for work).
    The script has no main guard: the processes must not run it again."""
    script = tmp_path / "parent.py"
    script.write_text(SERIALIZERS_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        children = parent.stdout.readline().split()
        assert len(children) == 2, parent.stderr.read() if parent.poll() is not None else children
    finally:
        parent.kill()
        parent.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(alive(int(pid)) for pid in children):
        time.sleep(0.1)
    assert not [pid for pid in children if alive(int(pid))], "serializers outlived their parent"


def test_a_closed_prefetch_stops_reading_and_its_thread_ends():
    """A run that fails after its reader started (a model that does not load) must not leave the reading thread
    blocked forever or reading on: a cluster's encoder runs many shards in one process."""
    import itertools
    import threading

    from lsr_index.runtime.threads import Prefetch

    def ends(name: str) -> bool:
        """Its own thread, by name: other tests' threads in this process may start or end meanwhile."""
        deadline = time.time() + 10
        while any(t.name == name for t in threading.enumerate()) and time.time() < deadline:
            time.sleep(0.01)
        return not any(t.name == name for t in threading.enumerate())

    read = []
    stream = Prefetch((read.append(i) or i for i in itertools.count()), depth=2, name="test-prefetch-endless")
    assert [next(stream), next(stream)] == [0, 1]
    stream.close()
    assert ends("test-prefetch-endless") and len(read) <= 6, len(read)
    failing = Prefetch(iter(int(x) for x in ["1", "x"]), name="test-prefetch-failing")
    assert next(failing) == 1
    with pytest.raises(ValueError):
        next(failing)
    assert ends("test-prefetch-failing")
    full = Prefetch(iter(int(x) for x in ["1", "x"]), depth=1, name="test-prefetch-full")  # the error waits behind
    time.sleep(0.3)  # an item nobody reads
    assert any(t.name == "test-prefetch-full" for t in threading.enumerate())
    full.close()
    assert ends("test-prefetch-full")


@pytest.mark.slow
def test_sigterm_saves_what_is_recorded_says_so_and_the_rerun_continues(tmp_path):
    """A scheduler's SIGTERM does not end the process where it stands: it says so and saves the parts recorded since
    the last once-a-second save, which would otherwise be lost (their files deleted as leftovers by the rerun)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({**json.loads(line), "id": f"{k}-" + json.loads(line)["id"]}) + "\n"
                              for k in range(4) for line in sample_lines()))
    out = tmp_path / "v"
    args = ["encode", str(corpus), "-o", str(out), "--doc-max-length", "32", "--max-tokens", "4096",
            "--checkpoint-seconds", "0", "--format", "jsonl"]
    proc = subprocess.Popen([sys.executable, "-m", "lsr_index", "--quiet", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and _chunks_recorded(out) < 1:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    at_stop = Manifest.load(out)
    assert proc.returncode == 143 and err.strip() == f"terminated: {kept_line(out)}"
    listed = {p.file for p in at_stop.chunks}
    on_disk = {f"shards/{p.name}" for p in (out / "shards").iterdir() if p.name.endswith(".chunk")}
    assert listed and listed <= on_disk  # what was recorded was saved (a chunk still being written may follow)
    resumed = run_cli("--quiet", *args)
    assert resumed.returncode == 0, resumed.stderr
    assert Manifest.load(out).stats.resumed_at == sum(c.docs for c in at_stop.chunks)


@pytest.mark.slow
def test_ctrl_c_once_the_encoding_is_complete_prints_no_traceback(tmp_path):
    """A Ctrl-C once the manifest says complete must not reach torch's exit handlers as a KeyboardInterrupt, which
    prints 'Exception ignored in atexit callback … KeyboardInterrupt': the run ends without a traceback."""
    out = tmp_path / "v"
    proc = subprocess.Popen([sys.executable, "-m", "lsr_index", "--quiet", "encode", str(SAMPLE), "-o", str(out),
                             "--doc-max-length", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (
            (out / "manifest.json").is_file() and json.loads((out / "manifest.json").read_text()).get("complete")):
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, -signal.SIGINT), (proc.returncode, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


SETTLING = textwrap.dedent("""
    import os, signal, sys, threading, time
    from lsr_index import cli
    cli.terminate_as_interrupt()
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread that may receive the signal
    fail = sys.argv[1] == "fail"
    try:
        with cli.signals_settled():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)
            if fail:
                raise OSError("the manifest could not be written")
            print("marked complete", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        print("nothing left to stop", flush=True)
    except KeyboardInterrupt:
        print("stopped by", signal.Signals(cli._RECEIVED[0]).name, flush=True)
""")


@pytest.mark.parametrize(("how", "said"), [("complete", ["marked complete", "nothing left to stop"]),
                                            ("fail", ["stopped by SIGTERM"])])
def test_a_signal_while_the_output_is_marked_complete_waits_then_is_dropped(how, said):
    """Held while the manifest is marked complete, whichever thread the kernel hands the signal to, then dropped; if
    marking fails, the signal stops the command as it would have."""
    run = subprocess.run([sys.executable, "-c", SETTLING, how], capture_output=True, text=True, timeout=300)
    assert run.stdout.splitlines() == said and run.returncode == 0, (run.stdout, run.stderr)


def test_a_stopped_command_ends_with_its_status_under_python_m(tmp_path):
    """Under `python -m`, a SIGTERM landing in code run from a string (the dataclasses the imports make) can leave
    CPython's "unhandled Ctrl-C" mark set: the process would print its message, then kill itself with SIGINT (status
    -2, not 143), now and then at start-up."""
    (tmp_path / "stopped_stage.py").write_text(textwrap.dedent("""
        import signal
        import click
        from lsr_index import cli
        click.echo("started", err=True)
        cli._RECEIVED[0] = signal.SIGTERM
        @cli.friendly_errors
        def stage():
            exec("raise KeyboardInterrupt")  # as a signal landing in a dataclass's generated __init__
        stage()
        """))
    run = subprocess.run([sys.executable, "-m", "stopped_stage"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 143, (run.returncode, run.stderr)
    assert run.stderr.splitlines() == ["started", "terminated: rerun the same command to continue where it stopped"]


def test_the_summary_gives_the_commands_whole_time_beside_the_encode_clock(tmp_path, splade_tiny):
    """The encode clock starts after the imports and the plan (seconds of their own), which a user waits for too."""
    import re

    done = run_cli("encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--doc-max-length", "16")
    assert done.returncode == 0, done.stderr
    found = re.search(r"in ([\d.]+) s: start-up .*; ([\d.]+) s since the command started\)$", done.stdout.strip())
    assert found, done.stdout
    assert float(found[2]) >= float(found[1]) > 0
