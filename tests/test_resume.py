"""Resume safety: settings that change shard layout, orphaned workers, stuck directories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli_runner import run_cli
from procs import children, wait_dead

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"
LSR = [sys.executable, "-m", "lsr_index", "--quiet"]


def lsr(*args: str) -> subprocess.CompletedProcess:
    return run_cli("--quiet", *args)


def _shards(out: Path) -> int:
    try:
        return len(json.loads((out / "manifest.json").read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def _kill_after_first_shard(cmd: list[str], out: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and _shards(out) < 1:
        time.sleep(0.02)
    return proc


def test_resume_with_another_shard_size_is_refused(tmp_path):
    out = tmp_path / "v"
    cmd = [*LSR, "encode", str(SAMPLE), "-o", str(out), "--shard-docs", "20", "--doc-max-length", "32",
           "--format", "jsonl"]
    proc = _kill_after_first_shard(cmd, out)
    proc.kill()
    proc.wait()
    assert 1 <= _shards(out) < 20, "the first run was not cut short: nothing to resume"
    again = lsr("encode", str(SAMPLE), "-o", str(out), "--shard-docs", "50", "--format", "jsonl",
                "--doc-max-length", "32")
    assert again.returncode == 1 and "shard_docs" in again.stderr, again.stderr


def test_workers_die_with_a_killed_parent(tmp_path):
    """Orphaned workers would go on writing shards nobody records, beside a rerun that takes the lock."""
    out = tmp_path / "v"
    cmd = [*LSR, "encode", str(SAMPLE), "-o", str(out), "--device", "cpu,cpu", "--shard-docs", "20",
           "--doc-max-length", "32", "--format", "jsonl"]
    proc = _kill_after_first_shard(cmd, out)
    workers = children(proc.pid)
    assert workers, "the run had no worker processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = len(list((out / "shards").glob("part-*")))
    # without the parent watch, the orphans would write the ~15 remaining shards in this time
    assert all(wait_dead(pid) for pid in workers), "workers outlived their parent"
    later = len(list((out / "shards").glob("part-*")))
    assert at_kill < 20 and later <= at_kill + 2, (at_kill, later)  # at most the shards already being renamed
    done = lsr("encode", str(SAMPLE), "-o", str(out), "--shard-docs", "20", "--doc-max-length", "32",
               "--format", "jsonl")  # one worker now: the rerun only has to find the lock free
    assert done.returncode == 0, done.stderr


def test_overwrite_recovers_a_damaged_manifest(tmp_path):
    out = tmp_path / "v"
    out.mkdir()
    (out / "shards").mkdir()
    (out / "shards" / "part-00000.jsonl").write_text("stale\n")
    (out / "manifest.json").write_text("{garbage")
    refused = lsr("encode", str(SAMPLE), "-o", str(out), "--doc-max-length", "32")
    assert refused.returncode == 1 and "manifest" in refused.stderr
    done = lsr("encode", str(SAMPLE), "-o", str(out), "--doc-max-length", "32", "--overwrite", "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "manifest.json").read_text())["docs"] == 400


def test_fixing_the_input_after_a_first_failed_record_just_works(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "fine"}\n{"id": "b"}\n')
    first = lsr("encode", str(corpus), "-o", str(tmp_path / "v"))
    assert first.returncode == 1 and "c.jsonl:2" in first.stderr
    corpus.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": "fixed"}\n')
    fixed = lsr("encode", str(corpus), "-o", str(tmp_path / "v"))
    assert fixed.returncode == 0, fixed.stderr


def test_lengths_past_the_model_and_unknown_devices_are_clear_errors(tmp_path):
    too_long = lsr("encode", str(SAMPLE), "-o", str(tmp_path / "v"), "--doc-max-length", "1024")
    assert too_long.returncode == 1 and "at most 512 tokens" in too_long.stderr and "Traceback" not in too_long.stderr
    bad_device = lsr("encode", str(SAMPLE), "-o", str(tmp_path / "w"), "--device", "gpu")
    assert bad_device.returncode == 1 and "--device" in bad_device.stderr and "Traceback" not in bad_device.stderr


def test_a_cpu_beside_gpus_is_refused(monkeypatch):
    """Each shard goes to one worker whole: a CPU worker's shard would take ~100x a GPU's, and the run waits for it.
    (This machine has no GPU: two are made visible to the device parser.)"""
    import pytest
    import torch

    from lsr_index.cli import _devices
    from lsr_index.errors import LsrIndexError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _devices("cuda:0,cuda:1") == ("cuda:0", "cuda:1") and _devices("cpu,cpu") == ("cpu", "cpu")
    with pytest.raises(LsrIndexError, match=r"--device cuda:0,cpu: a CPU beside GPUs holds them up"):
        _devices("cuda:0,cpu")


def test_a_missing_input_is_reported_before_torch_or_a_model_loads(tmp_path):
    """A mistyped path must not cost a torch import (seconds), nor a first run's model download."""
    code = ("import sys\nfrom lsr_index.cli import main\n"
            f"try:\n    main(['encode', {str(tmp_path / 'missing.jsonl')!r}, '-o', {str(tmp_path / 'v')!r}])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "LSR_INDEX_CACHE": str(tmp_path / "cache")})
    assert done.stdout.split() == ["1", "False", "False"], (done.stdout, done.stderr)
    assert done.stderr == f"error: {tmp_path / 'missing.jsonl'}: no such file or directory\n"
    assert not (tmp_path / "v").exists() and not (tmp_path / "cache").exists()




KILLED_ONCE_COMPLETE = """
import os, sys
from pathlib import Path
from lsr_index.encode.job import EncodeJob, EncodeOptions
from lsr_index.encode.run import encode_corpus
from lsr_index.vectors.manifest import Manifest

save = Manifest.save

def save_then_die(self, out):
    save(self, out)
    if self.complete:  # as a SIGKILL right after the complete manifest is durable
        os._exit(9)

Manifest.save = save_then_die
options = EncodeOptions(shard_docs=40, output_format="jsonl", progress=False, doc_max_length=16, piece_docs=8,
                        checkpoint_seconds=0.0)
encode_corpus(EncodeJob(inputs=(sys.argv[1],), options=options), Path(sys.argv[2]), ("cpu",))
"""


def test_a_kill_once_the_manifest_is_complete_leaves_no_chunk_files(tmp_path):
    """Shards joined from several checkpointed chunks: their chunk files go before the manifest says complete, so a
    kill just after it leaves a complete output holding nothing else (it is never resumed, which would delete them)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line + "\n" for line in SAMPLE.read_text().splitlines()[:100]))
    out = tmp_path / "v"
    run = subprocess.run([sys.executable, "-c", KILLED_ONCE_COMPLETE, str(corpus), str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 9, run.stderr
    from lsr_index.vectors.manifest import Manifest

    manifest = Manifest.load(out)
    assert manifest.complete and len(manifest.shards) == 3 and not manifest.chunks
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(Path(s.file).name for s in manifest.shards)
