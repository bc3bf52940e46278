"""CPU encodes on a machine shared with other work: threads follow the cores this process may use (or --threads),
waiting threads sleep, and a chunk is checkpointed before --checkpoint-seconds pass however slow the CPU is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import run_cli

from lsr_index.vectors.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "corpus.jsonl"
FAST = ["--doc-max-length", "32", "--format", "jsonl"]


def _one_core() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_the_cores_are_those_this_process_may_use():
    """A process pinned to one core (taskset, a scheduler's cpuset) counts one, not the machine's."""
    code = "from lsr_index.runtime.threads import host_cores; print(host_cores())"
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=_one_core,
                            cwd=ROOT, timeout=120)
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert pinned.stdout.split() == ["1"], pinned.stderr
    assert int(free.stdout) == len(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_an_encode_pinned_to_one_core_runs_one_thread(tmp_path):
    """torch's own default is every core of the machine; an encode pinned to one core runs one compute thread, as the
    manifest records."""
    out = tmp_path / "v"
    run = subprocess.run([sys.executable, "-m", "lsr_index", "--quiet", "encode", str(SAMPLE), "-o", str(out),
                          *FAST], capture_output=True, text=True, preexec_fn=_one_core, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    assert [w.cores for w in Manifest.load(out).stats.per_worker] == [1]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_threads_given_are_the_threads_torch_runs(tmp_path, monkeypatch, how):
    """OpenMP keeps a thread count per thread: the thread that encodes runs the threads given, whatever OpenMP work
    it did before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(before)  # this thread holds its own OpenMP thread count before the command runs
    out = tmp_path / "v"
    if how == "environment":
        monkeypatch.setenv("LSR_INDEX_THREADS", "1")
    try:
        run = run_cli("--quiet", "encode", str(SAMPLE), "-o", str(out), *FAST,
                      *(["--threads", "1"] if how == "option" else []))
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert run.returncode == 0, run.stderr
    assert threads == 1
    assert [w.cores for w in Manifest.load(out).stats.per_worker] == [1]


def test_threads_out_of_range_are_refused_in_one_line(tmp_path):
    run = run_cli("encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--threads", "0")
    assert run.returncode == 2 and "--threads" in run.stderr and "Traceback" not in run.stderr


def test_the_command_makes_waiting_threads_sleep_unless_told_otherwise(tmp_path, monkeypatch):
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads it: the command sets it first, and keeps a user's own."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert run_cli("presets").returncode == 0
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert run_cli("presets").returncode == 0
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_chunk_is_checkpointed_before_the_bound_passes_on_a_slow_cpu(tmp_path, monkeypatch):
    """Each piece made to take at least 0.4 s more, the bound 1 s: a chunk ends at the last piece end before the bound
    would pass (two pieces at most: a third would end past it), not at the first past it (three), and CPU pieces are
    small enough to checkpoint at all (64 documents: the GPU's would hold the whole sample)."""
    from lsr_index.api import encode
    from lsr_index.encode import plan, sink

    put = sink.ChunkSink.put

    def slow_put(self, *args):
        time.sleep(0.4)  # as if the model took longer: a piece's time runs from its start to its put
        return put(self, *args)

    monkeypatch.setattr(sink.ChunkSink, "put", slow_put)
    recorded = []
    record = plan.Plan.record

    def keep_chunk(self, chunk):
        recorded.append(chunk)
        return record(self, chunk)

    monkeypatch.setattr(plan.Plan, "record", keep_chunk)
    out = tmp_path / "v"
    manifest = encode(SAMPLE, out, device="cpu", doc_max_length=32, output_format="jsonl", checkpoint_seconds=1.0,
                      shard_docs=400)
    assert manifest.complete and manifest.docs == 400 and len(manifest.shards) == 1
    assert recorded, "the shard was written without a checkpoint"
    assert all(c.docs <= 2 * 64 for c in recorded), [c.docs for c in recorded]
    assert [(c.start, c.end) for c in recorded] == list(zip([0, *[c.end for c in recorded[:-1]]],
                                                             [c.end for c in recorded]))  # one after another
    assert len(recorded) >= 4  # 7 pieces of at most 64
    assert json.loads((out / "manifest.json").read_text())["chunks"] == []  # published: the chunks joined
