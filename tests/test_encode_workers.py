"""Local encoding workers (one process per device, `local.run_local_workers`): each starts without re-running the
caller's script, a worker that dies is one line, and none outlives its parent. Real processes on CPU devices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import alive, children, wait_dead

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"

# No main guard: multiprocessing's spawn would run all of it again in each worker.
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.plan import encode_corpus
    from lsr_index.errors import LsrIndexError
    print("script ran", flush=True)
    options = EncodeOptions(shard_docs=int(sys.argv[3]), output_format="jsonl", progress=False)
    try:
        manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    except LsrIndexError as exc:
        print("error:", exc, flush=True)
        sys.exit(1)
    print("workers", manifest.stats["workers"], "docs", manifest.docs, flush=True)
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
    """The sample 50 times over (20,000 documents, ids made unique): minutes of work on 2 cores."""
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
    from lsr_index.encode.plan import encode_corpus
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
    """Not "died; rerun": a rerun would fail the same way."""
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
    from lsr_index.encode.plan import encode_corpus
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
    print(*[w["started"] for w in manifest.stats["per_worker"]])
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
def test_workers_left_without_shards_are_named_in_a_note(tmp_path):
    """400 documents are one shard of the default size: the second worker has nothing to do, and the summary says
    why (too few shards) and what to change; its start-up is not the run's (the idle worker was "ready" when it
    ended). Over 16 shards there is no note, however the workers shared them (a loaded machine gave 325 / 75: one
    worker's model loaded seconds before the other's)."""
    from cli_runner import run_cli

    done = run_cli("encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--device", "cpu,cpu", "--doc-max-length", "32")
    assert done.returncode == 0, done.stderr
    assert "note: one worker encoded 400 of the 400 documents" in done.stderr
    assert "(1 of 100,000 documents here: lower --shard-docs)" in done.stderr
    stats = json.loads((tmp_path / "v" / "manifest.json").read_text())["stats"]
    busy = next(w for w in stats["per_worker"] if w["docs"])
    assert f"start-up {busy['startup_seconds']:.1f} s," in done.stdout, (done.stdout, stats["per_worker"])
    shared = run_cli("encode", str(SAMPLE), "-o", str(tmp_path / "w"), "--device", "cpu,cpu", "--doc-max-length",
                     "32", "--shard-docs", "25")
    assert shared.returncode == 0 and "note:" not in shared.stderr, shared.stderr


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
    assert err.strip().splitlines()[-1] == "interrupted: rerun the same command to continue where it stopped"
    assert all(wait_dead(pid, 10) for pid in workers)
    kept = Manifest.load(out)
    assert 1 <= len(kept.shards) < 16
    (out / "shards" / ".claims-1").mkdir()  # as a SIGKILLed run leaves its workers' claims
    (out / "shards" / ".claims-1" / "00003").touch()
    rerun = cli(out)
    assert rerun.wait(timeout=600) == 0, rerun.communicate()
    assert [(s.file, s.sha256) for s in Manifest.load(out).shards] == \
        [(s.file, s.sha256) for s in Manifest.load(tmp_path / "whole").shards]
    assert not [p.name for p in (out / "shards").iterdir() if p.name.startswith(".claims-")]


CLAIMER = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    from lsr_index.encode.job import Assignment
    mine = Assignment(done=frozenset({7}), worker=int(sys.argv[2]), workers=3, claims=sys.argv[1])
    shards = list(range(300))
    random.Random(int(sys.argv[2])).shuffle(shards)
    print("ready", flush=True)
    sys.stdin.readline()  # all three start at once
    print(*[k for k in shards if mine.mine(k)])
""")


def test_each_shard_is_claimed_by_exactly_one_worker(tmp_path):
    """Three processes racing over 300 shards in different orders: every shard not published goes to one of them."""
    racers = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path), str(w)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for w in range(3)]
    assert [racer.stdout.readline() for racer in racers] == ["ready\n"] * 3
    for racer in racers:
        racer.stdin.write("go\n")
        racer.stdin.flush()
    claimed = [[int(k) for k in racer.communicate(timeout=60)[0].split()] for racer in racers]
    assert sorted(k for ks in claimed for k in ks) == [k for k in range(300) if k != 7]


SLOW_SECOND = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lsr_index.encode import task, local
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.plan import encode_corpus
    local._forks_workers = lambda devices: True  # the workers are forks of this process, as on GPUs
    put = sink.ShardSink.put
    def slowed(self, *args):  # the second worker's device, slower: 0.5 s more per shard of 100 documents
        if self.assignment.worker == 1:
            time.sleep(0.5)
        return put(self, *args)
    sink.ShardSink.put = slowed
    options = EncodeOptions(shard_docs=100, output_format="jsonl", progress=False, doc_max_length=32)
    manifest = encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu", "cpu"))
    print(*[w["docs"] for w in manifest.stats["per_worker"]])
""")


@pytest.mark.slow
def test_a_slower_worker_takes_fewer_shards_and_the_bytes_stay_one_workers(tmp_path):
    """Shards go to the worker whose reader reaches them first: a fixed split (k mod W) gave each of two workers 16
    of 32 shards, so the faster waited for the slower; here it took 20 in a run measured while writing this."""
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.plan import encode_corpus
    from lsr_index.vectors.manifest import Manifest

    lines = SAMPLE.read_text().splitlines()
    corpus = tmp_path / "c.jsonl"  # 3,200 documents: 32 shards
    corpus.write_text("".join(line.replace('{"id": "', f'{{"id": "{copy}-', 1) + "\n"
                              for copy in range(8) for line in lines))
    run = subprocess.run([sys.executable, "-c", SLOW_SECOND, str(corpus), str(tmp_path / "two")], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    fast, slow = map(int, run.stdout.split())
    assert fast + slow == 3200 and fast >= slow + 400, (fast, slow)
    assert not [p.name for p in (tmp_path / "two" / "shards").iterdir() if not p.name.startswith("part-")]
    options = EncodeOptions(shard_docs=100, output_format="jsonl", progress=False, doc_max_length=32)
    one = encode_corpus(EncodeJob(inputs=(str(corpus),), options=options), tmp_path / "one", ("cpu",))
    assert [(s.file, s.sha256) for s in Manifest.load(tmp_path / "two").shards] == \
        [(s.file, s.sha256) for s in one.shards]
