"""Shared fixtures: the real embedded model (fetched once into the user cache), the shipped sample."""

from __future__ import annotations

import os
import secrets
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
