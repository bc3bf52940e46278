"""LSR_INDEX_TIMELINE: a command's steps, from its parsing to its manifest, each printed once with its time since the
process started, in the order they happen; without the variable, nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "corpus.jsonl"
STEPS = ["command parsed", "model resolved and identified", "devices: cpu", "output planned",
         "input cut into 1 unit(s)", "tokenizer and 0 serializer(s) ready for cpu", "weights on cpu", "model on cpu",
         "model warmed up on cpu", "first piece on cpu", "last batch encoded on cpu", "vectors written on cpu",
         "every unit encoded", "last shard published", "manifest complete", "encoded"]


def _encode(out: Path, timeline: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LSR_INDEX_TIMELINE"}
    if timeline:
        env["LSR_INDEX_TIMELINE"] = "1"
    return subprocess.run([sys.executable, "-m", "lsr_index", "--quiet", "encode", str(SAMPLE), "-o", str(out),
                           "--doc-max-length", "32", "--format", "jsonl"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def test_a_run_prints_each_step_once_in_order_from_parse_to_manifest(tmp_path):
    run = _encode(tmp_path / "v", timeline=True)
    assert run.returncode == 0, run.stderr
    printed = re.findall(r"^timeline (\d+\.\d{3}) s: (.*)$", run.stderr, re.MULTILINE)
    assert [step for _, step in printed] == STEPS, run.stderr
    times = [float(t) for t, _ in printed]
    assert times == sorted(times) and times[0] > 0
    quiet = _encode(tmp_path / "w", timeline=False)
    assert quiet.returncode == 0 and "timeline" not in quiet.stderr, quiet.stderr
