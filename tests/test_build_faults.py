"""Faults of the direct builder: its writer processes die with the build (SIGKILL, Ctrl-C), a full disk
while Lucene writes is one line, and nothing is ever published half-built. Real processes, signals and a
real full filesystem (a small tmpfs)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import alive, children, wait_dead
from test_faults import ENV, LSR, leftovers, synthetic_vectors

pytestmark = [pytest.mark.lucene, pytest.mark.slow]


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "vectors"
    synthetic_vectors(out, docs=40_000, terms=30, shard_docs=10_000)  # two writers, each busy long enough to be hit
    return out


def _writers(pid: int) -> list[int]:
    """The build's writer processes (python -m lsr_index.engines.lucene.writer)."""
    return children(pid, b"lsr_index.engines.lucene.writer")


def _start(vectors: Path, index: Path) -> tuple[subprocess.Popen, list[int]]:
    """`lsr-index build` leading a process group of its own (as a terminal runs it), returned once both writers
    write."""
    proc = subprocess.Popen([*LSR, "build", "--vectors", str(vectors), "--index", str(index), "--heap", "1g",
                             "--threads", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)
    work = index.parent / f".{index.name}.building-{proc.pid}"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        writers = _writers(proc.pid)
        if len(writers) == 2 and (work / "index").is_dir() and (work / "part-1").is_dir():
            time.sleep(0.5)
            assert proc.poll() is None and all(map(alive, writers)), "the build ended before the fault"
            return proc, writers
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the writers did not start: {proc.communicate()}")


def test_sigkill_of_the_build_kills_its_writers_and_a_rerun_succeeds(vectors, tmp_path):
    index = tmp_path / "index"
    proc, writers = _start(vectors, index)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert all(wait_dead(w, 5) for w in writers), "a writer outlived its SIGKILLed build"
    finally:
        for w in writers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
    assert not index.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".index.building-{proc.pid}", ".index.lock"]
    done = subprocess.run([*LSR, "build", "--vectors", str(vectors), "--index", str(index), "--heap", "1g"],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"note: removed {tmp_path / f'.index.building-{proc.pid}'}, the work "
                                        f"directory of an earlier build of {index} that was killed"]
    assert json.loads((index / "lsr-index.json").read_text())["documents"] == 40_000
    assert leftovers(tmp_path) == []


def test_ctrl_c_stops_the_writers_and_leaves_nothing(vectors, tmp_path):
    """SIGINT to the whole foreground process group, as a terminal sends it: the writers ignore it, the
    build stops them, removes its work and says how to resume."""
    index = tmp_path / "index"
    proc, writers = _start(vectors, index)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["interrupted: rerun the same command to continue where it stopped"]
    assert not any(map(alive, writers)) and not index.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_build_alone_stops_it_and_removes_its_work(vectors, tmp_path, how):
    """`kill PID` (SIGTERM, a scheduler's stop), or SIGINT to the build process only: its writers stop, its work
    directory goes, and it ends by SIGTERM (143 in a shell) or as interrupted (130); nothing is left beside the
    index but its lock file."""
    index = tmp_path / "index"
    proc, writers = _start(vectors, index)
    os.kill(proc.pid, how)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == (-signal.SIGTERM if how == signal.SIGTERM else 130), stderr
    assert "Traceback" not in stderr
    assert all(wait_dead(w, 10) for w in writers), "a writer outlived its stopped build"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".index.lock"]


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: Lucene's writes fail with the kernel's own ENOSPC (needs permission to mount)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_disk_full_while_lucene_writes_is_one_line_and_publishes_nothing(vectors, small_disk):
    index = small_disk / "index"
    done = subprocess.run([*LSR, "build", "--vectors", str(vectors), "--index", str(index), "--heap", "1g"],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: building {index}: an index writer failed: ")
    assert line.endswith("No space left on device (free some space and rerun); nothing was published")
    assert sorted(os.listdir(small_disk)) == [".index.lock"]
