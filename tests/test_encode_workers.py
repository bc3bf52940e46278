"""Local encoding workers (one process per device, `local.LocalExecutor`): each starts without re-running the
caller's script, a worker that dies is one line, and none outlives its parent. Real processes on CPU devices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from procs import alive, children, wait_dead

from lsr_index.vectors.manifest import Manifest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"

# No main guard: multiprocessing's spawn would run all of it again in each worker.
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.errors import LsrIndexError
    print("script ran", flush=True)
    options = EncodeOptions(shard_docs=int(sys.argv[3]), output_format="jsonl", progress=False)
    try:
        manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    except LsrIndexError as exc:
        print("error:", exc, flush=True)
        sys.exit(1)
    print("workers", manifest.stats.workers, "docs", manifest.docs, flush=True)
""")


def start(tmp_path: Path, corpus: Path, shard_docs: int) -> subprocess.Popen:
    script = tmp_path / "encode_two.py"
    script.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(script), str(corpus), str(tmp_path / "vectors"), str(shard_docs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def workers_of(parent: subprocess.Popen) -> list[int]:
    deadline = time.time() + 60
    while time.time() < deadline and parent.poll() is None:
        found = children(parent.pid, b"encode.local:worker_main")
        if len(found) == 2:
            return found
        time.sleep(0.05)
    raise AssertionError(f"two workers never ran: {parent.communicate()}")


def big_corpus(tmp_path: Path) -> Path:
    """The sample 50 times over (20,000 documents, ids made unique): enough work that the workers are still encoding
    when a test kills one of them or their parent."""
    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "big.jsonl"
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(50) for line in lines))
    return corpus


@pytest.mark.slow
def test_a_script_without_a_main_guard_runs_once_with_two_workers(tmp_path):
    parent = start(tmp_path, SAMPLE, 150)
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 0, err
    assert out.splitlines() == ["script ran", "workers 2 docs 400"], (out, err)


@pytest.mark.slow
def test_a_killed_worker_is_one_line_and_the_other_ends_too(tmp_path):
    parent = start(tmp_path, big_corpus(tmp_path), 1000)
    first, second = workers_of(parent)
    time.sleep(1.0)  # the workers loading their model
    subprocess.run(["kill", "-9", str(first)], check=True)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 1, (out, err)
    assert out.splitlines()[-1] == \
        "error: the encoding worker on cpu died (exit code -9); rerun the same command to resume", out
    assert "Traceback" not in err, err
    assert wait_dead(second), "the other worker outlived the run"


@pytest.mark.slow
def test_workers_end_with_a_killed_parent(tmp_path):
    parent = start(tmp_path, big_corpus(tmp_path), 1000)
    workers = workers_of(parent)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert all(wait_dead(pid, 30) for pid in workers), [pid for pid in workers if alive(pid)]


UNREADABLE_JOB = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.inputs.corpus import Fields
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.errors import LsrIndexError

    class MyFields(Fields):  # defined in the script run: a worker cannot import it
        pass

    if __name__ == "__main__":
        job = EncodeJob(inputs=(sys.argv[1],), fields=MyFields(), options=EncodeOptions(progress=False))
        try:
            encode_corpus(job, Path(sys.argv[2]), ("cpu", "cpu"))
        except LsrIndexError as exc:
            print("error:", exc)
""")


def test_a_job_a_worker_cannot_read_is_one_line_that_says_why(tmp_path):
    """One line saying why, not "died; rerun": a rerun would fail the same way."""
    script = tmp_path / "unreadable.py"
    script.write_text(UNREADABLE_JOB)
    run = subprocess.run([sys.executable, str(script), str(SAMPLE), str(tmp_path / "vectors")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert run.stdout.startswith("error: the encoding worker on cpu could not read its job (AttributeError: ") and \
        "MyFields" in run.stdout and "must be importable" in run.stdout, run.stdout


FORKED = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode import local
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    import os, threading
    threads, fork = [], os.fork
    def counted_fork():
        threads.append(threading.active_count())
        return fork()
    os.fork = counted_fork
    if sys.argv[3] == "fork":  # as on GPUs (CPU workers start afresh: local._forks_workers)
        local._forks_workers = lambda devices: True
    options = EncodeOptions(shard_docs=150, output_format="jsonl", progress=False)
    manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    print(*[w.started for w in manifest.stats.per_worker])
    print("threads at each fork:", *threads)
""")


@pytest.mark.slow
def test_forked_workers_write_what_started_ones_write(tmp_path):
    """The fork path GPU workers take, run on CPU: the same shards, byte for byte, as workers started afresh; each
    fork made while this process runs no other thread (the relays start once all are forked)."""
    from lsr_index.vectors.manifest import Manifest

    shards = {}
    for how in ("fork", "new interpreter"):
        run = subprocess.run([sys.executable, "-c", FORKED, str(SAMPLE), str(tmp_path / how), how],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
        assert run.stdout.splitlines() == [f"{how} {how}", "threads at each fork: 1 1" if how == "fork" else
                                           "threads at each fork:"], run.stdout
        shards[how] = [(s.file, s.docs, s.sha256) for s in Manifest.load(tmp_path / how).shards]
    assert len(shards["fork"]) == 3 and shards["fork"] == shards["new interpreter"]


@pytest.mark.slow
def test_workers_left_without_units_are_named_in_a_note(tmp_path):
    """The sample (400 documents, half a megabyte) is one unit: the second worker has nothing to do, and the summary
    says why; its start-up is not the run's (the idle worker was "ready" when it ended). An input of many units has
    no note, however the workers shared them."""
    from cli_runner import run_cli

    done = run_cli("encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--device", "cpu,cpu", "--doc-max-length", "32")
    assert done.returncode == 0, done.stderr
    assert "note: one worker encoded 400 of the 400 documents" in done.stderr
    assert "this one holds 1 for 2 workers" in done.stderr
    stats = Manifest.load(tmp_path / "v").stats
    busy = next(w for w in stats.per_worker if w.docs)
    assert f"start-up {busy.startup_seconds:.1f} s," in done.stdout, (done.stdout, stats.per_worker)
    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "c.jsonl"  # 6.3 MB: six units of 1 MiB
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(10) for line in lines))
    shared = run_cli("encode", str(corpus), "-o", str(tmp_path / "w"), "--device", "cpu,cpu", "--doc-max-length",
                     "32")
    assert shared.returncode == 0 and "note:" not in shared.stderr, shared.stderr
    # a started worker ends itself (its watch on stdin would otherwise abort the interpreter's shutdown)
    assert "Fatal Python error" not in done.stderr + shared.stderr, done.stderr + shared.stderr


FORKED_CLI = textwrap.dedent("""
    import sys
    from lsr_index.encode import local
    local._forks_workers = lambda devices: True  # as on GPUs
    from lsr_index.cli import main
    sys.argv = ["lsr-index", "encode", sys.argv[1], "-o", sys.argv[2], "--device", "cpu,cpu", "--shard-docs", "200",
                "--doc-max-length", "32", "--format", "jsonl", "--checkpoint-seconds", "0"]
    main()
""")


def _recorded_shards(out: Path) -> int:
    try:
        return len(json.loads((out / "manifest.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
def test_ctrl_c_ends_forked_workers_and_the_rerun_writes_an_uninterrupted_runs_bytes(tmp_path):
    """Ctrl-C as a terminal sends it, to the foreground group: forked workers are in groups of their own, and the
    parent ends them; what they recorded is kept, and the rerun completes it."""
    from lsr_index.vectors.manifest import Manifest

    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "c.jsonl"  # 3,200 documents: 16 shards
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(8) for line in lines))

    def cli(out: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", FORKED_CLI, str(corpus), str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, process_group=0)

    whole = cli(tmp_path / "whole")
    assert whole.wait(timeout=600) == 0, whole.communicate()
    out = tmp_path / "cut"
    run = cli(out)
    deadline = time.time() + 300
    while time.time() < deadline and run.poll() is None and not _recorded_shards(out):
        time.sleep(0.05)  # recorded, not just written: a shard whose event the parent has not read yet is redone
    workers = children(run.pid, b"")
    assert run.poll() is None and len(workers) == 2, "the run ended before it could be interrupted"
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert all(wait_dead(pid, 10) for pid in workers)
    kept = Manifest.load(out)
    assert 1 <= len(kept.shards) < 16
    documents = kept.docs + sum(c.docs for c in kept.chunks)
    assert err.strip().splitlines()[-1] == \
        f"interrupted: kept {documents:,} documents; rerun the same command to continue where it stopped"
    rerun = cli(out)
    assert rerun.wait(timeout=600) == 0, rerun.communicate()
    assert [(s.file, s.sha256) for s in Manifest.load(out).shards] == \
        [(s.file, s.sha256) for s in Manifest.load(tmp_path / "whole").shards]
    assert not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".")]


def test_each_unit_is_claimed_by_exactly_one_task_and_numbered_once(tmp_path, monkeypatch):
    """Three threads racing over the units of a corpus cut into many: every unit goes to one of them, and every
    batch is numbered once, in stream order, whoever parsed it."""
    import threading

    from lsr_index.encode.units import Numberings, Units
    from lsr_index.inputs import units as units_module
    from lsr_index.inputs.corpus import CorpusReader

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(3000)))
    monkeypatch.setattr(units_module, "FIRST_BYTES", 2000)
    reader = CorpusReader(corpus, batch_size=50)
    planned = reader.units()
    assert len(planned) > 10
    shared = Units(planned, reader.sequencer(planned))
    claimed: list[list[int]] = [[], [], []]
    firsts: dict[tuple[int, int], int] = {}

    def task(k: int) -> None:
        numberings = Numberings()
        while (unit := shared.claim()) is not None:
            claimed[k].append(unit.index)
            for batch in reader.parse(unit):
                shared.submit(batch.summary, numberings.put)
                numbered = numberings.get(unit.index, batch.summary.batch)
                firsts[unit.index, batch.summary.batch] = numbered.first

    threads = [threading.Thread(target=task, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(u for us in claimed for u in us) == list(range(len(planned)))
    sequential = [0]
    for batch in reader:  # one reader, unit after unit: the same batches, numbered alike
        sequential.append(sequential[-1] + batch.num_rows)
    assert [firsts[key] for key in sorted(firsts)] == sequential[:-1] and shared.sequencer.n_docs == 3000


SLOW_SECOND = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lsr_index.encode import local, task
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.inputs import units
    local._forks_workers = lambda devices: True  # the workers are forks of this process, as on GPUs
    units.FIRST_BYTES = units.LARGEST_BYTES = 50_000  # 40 units of ~40 documents
    from lsr_index.encode import feed
    feed._PARSED_AHEAD = 1  # and pieces of 16 documents: a task holds a few dozen documents ahead of its encoding
    run, put = task.ShardEncoder.run, task.ChunkSink.put
    slow, resumed = [False], [None]
    def slowed(self, *args, worker=0, **kwargs):
        slow[0] = worker == 1
        return run(self, *args, worker=worker, **kwargs)
    def late(self, *args):  # the second worker's device, a quarter as fast whatever the machine's load: after each
        if slow[0] and resumed[0] is not None:  # piece but its first it waits three times what the piece took
            time.sleep(3 * (time.monotonic() - resumed[0]))
        resumed[0] = time.monotonic()
        return put(self, *args)
    task.ShardEncoder.run, task.ChunkSink.put = slowed, late
    options = EncodeOptions(shard_docs=100, output_format="jsonl", progress=False, doc_max_length=32, piece_docs=16)
    manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    print(*[w.docs for w in manifest.stats.per_worker])
""")


@pytest.mark.slow
def test_a_slower_worker_takes_fewer_units_and_the_bytes_stay_one_workers(tmp_path):
    """Units go to the worker that asks first: the faster worker claims more of them, and the shards, written from
    both workers' chunks, are the bytes one worker writes."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.vectors.manifest import Manifest

    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "c.jsonl"  # 1,600 documents: 16 shards
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(4) for line in lines))
    run = subprocess.run([sys.executable, "-c", SLOW_SECOND, str(corpus), str(tmp_path / "two")], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    fast, slow = map(int, run.stdout.split())
    assert fast + slow == 1600 and fast >= slow + 400, (fast, slow)
    assert not [p.name for p in (tmp_path / "two" / "shards").iterdir() if not p.name.startswith("part-")]
    options = EncodeOptions(shard_docs=100, output_format="jsonl", progress=False, doc_max_length=32, piece_docs=16)
    one = encode_corpus(EncodeJob(inputs=(str(corpus),), options=options), tmp_path / "one", ("cpu",))
    assert [(s.file, s.sha256) for s in Manifest.load(tmp_path / "two").shards] == \
        [(s.file, s.sha256) for s in one.shards]


FORKED_READERS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode import local, task
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.inputs import units
    local._forks_workers = lambda devices: True  # forked workers, each reading in input processes, as on GPUs
    task.reads_in_a_process = lambda device: True
    task.readers_for = lambda cores: 2
    units.FIRST_BYTES = units.LARGEST_BYTES = 20_000  # some 50 units
    options = EncodeOptions(shard_docs=300, output_format="jsonl", progress=False, doc_max_length=32,
                            checkpoint_seconds=0)
    manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    print(manifest.stats.units, *[w.readers for w in manifest.stats.per_worker])
""")


@pytest.mark.slow
def test_forked_workers_each_reading_in_two_input_processes_write_one_workers_bytes(tmp_path):
    """Two workers, each with two input processes claiming units of its own: four readers share the units, and the
    shards are the bytes one worker reading in threads writes."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus
    from lsr_index.vectors.manifest import Manifest

    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "c.jsonl"  # 1,200 documents: 4 shards
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(3) for line in lines))
    run = subprocess.run([sys.executable, "-c", FORKED_READERS, str(corpus), str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    units, *readers = map(int, run.stdout.split())
    assert units > 20 and readers == [2, 2], run.stdout
    options = EncodeOptions(shard_docs=300, output_format="jsonl", progress=False, doc_max_length=32)
    one = encode_corpus(EncodeJob(inputs=(str(corpus),), options=options), tmp_path / "one", ("cpu",))
    two = Manifest.load(tmp_path / "two")
    assert two.complete and [(s.file, s.sha256, s.input) for s in two.shards] == \
        [(s.file, s.sha256, s.input) for s in one.shards]
    assert two.truncation == one.truncation


def test_a_worker_records_how_long_it_waited_for_input_and_for_the_writer(tmp_path, monkeypatch):
    """A worker's stats say what held its model up after start-up: here each piece after the first is read only once
    the worker has handed the previous one to the writer, half a second later, so the worker waits at least that for
    each whatever its own speed; the writer keeps pace (its wait stays small); both fit in the run's time."""
    from lsr_index.encode import feed, sink
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode_corpus

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line + "\n" for line in SAMPLE.read_text().splitlines()[:96]))
    tokenize, put = feed.tokenize_pieces, sink.ChunkSink.put
    handed = threading.Semaphore(0)

    def counted(self, *args, **kwargs):
        put(self, *args, **kwargs)
        handed.release()

    def slowly(items, *args):
        for k, item in enumerate(tokenize(items, *args)):
            if k:  # on CPU the worker asks for this piece once the previous one is handed over
                assert handed.acquire(timeout=300), "the worker never handed a piece over"
                time.sleep(0.5)
            yield item

    monkeypatch.setattr(sink.ChunkSink, "put", counted)
    monkeypatch.setattr(feed, "tokenize_pieces", slowly)
    options = EncodeOptions(shard_docs=100, output_format="jsonl", progress=False, doc_max_length=8, piece_docs=16)
    manifest = encode_corpus(EncodeJob(inputs=(str(corpus),), options=options), tmp_path / "out", ("cpu",))
    worker, = manifest.stats.per_worker
    after_startup = manifest.stats.seconds - worker.startup_seconds
    assert 5 * 0.45 <= worker.input_wait_seconds <= after_startup  # six pieces: five waited for after the first
    assert 0 <= worker.output_wait_seconds < 0.5 * after_startup
    saved = Manifest.load(tmp_path / "out").stats.per_worker[0]
    assert (saved.input_wait_seconds, saved.output_wait_seconds) == (worker.input_wait_seconds,
                                                                     worker.output_wait_seconds)


@pytest.mark.parametrize(("visible", "device", "sees", "named"), [
    (None, "cuda:2", "2", "cuda:0"),
    ("4,5,6,7", "cuda:1", "5", "cuda:0"),
    ("GPU-0aa1, GPU-77c2", "cuda:1", "GPU-77c2", "cuda:0"),
    ("4,5", "cuda:3", "4,5", "cuda:3"),
    (None, "cpu", None, "cpu"),
])
def test_a_gpu_worker_sees_only_its_own_gpu(monkeypatch, visible, device, sees, named):
    """A worker's CUDA_VISIBLE_DEVICES names only its GPU (the caller's own list kept: cuda:k is its k-th entry), and
    the worker calls it cuda:0; a device beyond the caller's list, or a CPU, is left as it is."""
    from lsr_index.encode.local import only_its_gpu

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert only_its_gpu(device) == named
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == sees
