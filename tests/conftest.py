"""Shared fixtures: the real embedded model (fetched once into the user cache), the shipped sample."""

from __future__ import annotations

import os
import secrets
from collections import Counter
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding slow tests first, those of fewest tests (one long test: the SciFact reproduction) leading;
    the rest in their order. With one process per core taking whole files, the longest then start at once
    instead of running alone at the end while the other cores idle."""
    sizes = Counter(item.path for item in items)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in slow_files, sizes[item.path] if item.path in slow_files else 0))


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
    from lsr_index.models import load_model

    return load_model("splade-tiny")


@pytest.fixture(scope="session")
def scifact() -> Path:
    if not (SCIFACT / "corpus.jsonl").exists():
        pytest.skip("../shared/data/scifact is not present")
    return SCIFACT
