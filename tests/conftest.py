"""Shared fixtures: the real embedded model (fetched once into the user cache), the shipped sample."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
SCIFACT = ROOT.parent / "shared" / "data" / "scifact"


def pytest_configure(config: pytest.Config) -> None:
    """Off the GPU, Triton kernels run under its interpreter, which must be chosen before triton's first import:
    set here, before any test module is collected, so that no module order can skip the kernel's CPU tests."""
    markexpr = config.option.markexpr or ""
    if "gpu" not in markexpr.replace("not gpu", ""):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if "LSR_INDEX_CACHE" not in os.environ:
        _private_cache()
    # a suite started in the background of a script inherits SIGINT ignored, and so would every process a test
    # starts: the Ctrl-C tests would then interrupt nothing. With a handler here, started processes get the default
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:  # likewise: the SIGTERM tests need it to end a process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist runs a test process per core: each, and the CLI processes it starts, computes on one thread.
        # Two-thread matmuls in two processes on two cores wait on each other's descheduled threads at every
        # parallel region, and the CPU head's cache-sized blocks open one every few milliseconds.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
            os.environ.setdefault(name, "1")


def _private_cache() -> None:
    """The run's own cache directory (inherited by the test processes and every process they start), sharing only the
    user's downloaded models: what the tests make there (model identity records of temporary model directories) is
    never left in the user's cache."""
    user = Path.home() / ".cache" / "lsr-index"
    (user / "models").mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="lsr-index-test-cache-"))
    (run / "models").symlink_to(user / "models", target_is_directory=True)
    os.environ["LSR_INDEX_CACHE"] = str(run)
    atexit.register(shutil.rmtree, run, ignore_errors=True)


# The files that take longest, longest first (each file on one test process): handed out to the test processes in
# this order, before the many short files (pytest-xdist would order files by test count, which puts the one-test
# SciFact file last, alone at the end of the run). addopts carries --no-loadscope-reorder for this.
LONGEST_FIRST = ("test_ray.py", "test_scifact.py", "test_pipeline.py", "test_encode_robustness.py",
                 "test_encode_workers.py", "test_build.py", "test_faults.py", "test_resume.py",
                 "test_search_signals.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


@pytest.fixture
def seed() -> int:
    """A fresh seed for each test's random inputs; a failure prints it, and LSR_TEST_SEED=N replays that run."""
    return int(os.environ.get("LSR_TEST_SEED") or secrets.randbits(31))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    seed = getattr(item, "funcargs", {}).get("seed")
    if report.failed and seed is not None:
        report.sections.append(("random inputs", f"LSR_TEST_SEED={seed} reproduces them"))
    return report


@pytest.fixture(scope="session")
def splade_tiny():
    from lsr_index.model.load import load_model

    return load_model("splade-tiny")


@pytest.fixture(scope="session")
def scifact() -> Path:
    if not (SCIFACT / "corpus.jsonl").exists():
        pytest.skip("../shared/data/scifact is not present")
    return SCIFACT
