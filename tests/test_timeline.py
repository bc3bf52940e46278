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


def _encode(out: Path, timeline: bool, device: str = "cpu") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LSR_INDEX_TIMELINE"}
    if timeline:
        env["LSR_INDEX_TIMELINE"] = "1"
    return subprocess.run([sys.executable, "-m", "lsr_index", "--quiet", "encode", str(SAMPLE), "-o", str(out),
                           "--doc-max-length", "32", "--format", "jsonl", "--device", device], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)


def _steps(stderr: str) -> list[tuple[float, str]]:
    return [(float(t), step) for t, step in re.findall(r"^timeline (\d+\.\d{3}) s: (.*)$", stderr, re.MULTILINE)]


def test_a_run_prints_each_step_once_in_order_from_parse_to_manifest(tmp_path):
    run = _encode(tmp_path / "v", timeline=True)
    assert run.returncode == 0, run.stderr
    printed = _steps(run.stderr)
    assert [step for _, step in printed] == STEPS, run.stderr
    times = [t for t, _ in printed]
    assert times == sorted(times) and times[0] > 0
    quiet = _encode(tmp_path / "w", timeline=False)
    assert quiet.returncode == 0 and "timeline" not in quiet.stderr, quiet.stderr


def test_several_workers_print_their_steps_and_the_planner_its_own_around_them(tmp_path):
    """Each worker process prints its steps (times from its own start); the planner prints when every worker is done
    and when all have ended, before the last shard and the manifest."""
    run = _encode(tmp_path / "v", timeline=True, device="cpu,cpu")
    assert run.returncode == 0, run.stderr
    steps = [step for _, step in _steps(run.stderr)]
    planner = [s for s in steps if not s.endswith(" on cpu") and not s.startswith("tokenizer and")]
    assert planner == ["command parsed", "model resolved and identified", "devices: cpu, cpu", "output planned",
                       "input cut into 1 unit(s)", "every worker done", "workers ended", "every unit encoded",
                       "last shard published", "manifest complete", "encoded"], run.stderr
    for step in ("weights on cpu", "model warmed up on cpu", "last batch encoded on cpu", "vectors written on cpu"):
        assert steps.count(step) == 2, run.stderr
    assert steps.index("every worker done") > max(i for i, s in enumerate(steps) if s == "vectors written on cpu")
