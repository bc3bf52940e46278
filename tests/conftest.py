"""Shared fixtures: the real embedded model (fetched once into the user cache), the shipped sample."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
SCIFACT = ROOT.parent / "shared" / "data" / "scifact"


@pytest.fixture(scope="session")
def splade_tiny():
    from lsr_index.models import load_model

    return load_model("splade-tiny")


@pytest.fixture(scope="session")
def scifact() -> Path:
    if not (SCIFACT / "corpus.jsonl").exists():
        pytest.skip("../shared/data/scifact is not present")
    return SCIFACT
