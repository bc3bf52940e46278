"""The README's Usage block runs as written, right after its main job (pipelines/sample.sh), in a copy of the
repository's layout: every command exits 0 and writes what its comment says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def usage_commands() -> list[list[str]]:
    """The indented command lines of the README's Usage section, as argument lists."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Usage\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"\n\n((?:    lsr-index .*\n)+)", section).group(1)
    return [shlex.split(line.strip(), comments=True) for line in block.splitlines()]


def test_the_usage_block_names_only_lsr_index_commands():
    commands = usage_commands()
    assert len(commands) >= 5 and all(c[0] == "lsr-index" for c in commands)


@pytest.mark.slow
def test_the_usage_block_runs_verbatim_after_the_sample(tmp_path):
    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    lsr = [sys.executable, "-m", "lsr_index"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = (ROOT / "pipelines" / "sample.sh").read_text()
    for line in script.splitlines():  # the main job's commands, as sample.sh runs them
        if line.startswith("$LSR "):
            words = shlex.split(line.removeprefix("$LSR "))
            done = subprocess.run([*lsr, "-q", "--workdir", "lsr-out", *words], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, (words, done.stderr)
    for command in usage_commands():
        done = subprocess.run([*lsr, *command[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, (command, done.stderr)
    assert (tmp_path / "lsr-out" / "runs" / "queries.trec").is_file()
    assert (tmp_path / "lsr-out" / "stats.png").stat().st_size > 0
