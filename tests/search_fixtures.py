"""Real indexes for the search tests, made without encoding a corpus: the real ShardWriter and Manifest write
the vectors, `build_index` builds a real Lucene index, and the record names the real embedded model, so that
`search` loads it and encodes real queries against them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lsr_index.vectors import shards
from lsr_index.vectors.quantize import SparseVectors

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"


def write_vectors(out: Path, model, docs: dict[str, dict[str, int]], scale: float = 100.0,
                  query_max_length: int = 64) -> Path:
    """A complete vectors directory holding `docs` ({id: {term: impact}}), recorded as encoded by `model`."""
    vocab = np.array(sorted({t for vector in docs.values() for t in vector}), dtype=object)
    column = {term: i for i, term in enumerate(vocab)}
    rows = [sorted((column[t], w) for t, w in vector.items()) for vector in docs.values()]
    vectors = SparseVectors(np.cumsum([0] + [len(r) for r in rows]).astype(np.int64),
                            np.array([t for r in rows for t, _ in r], dtype=np.int32),
                            np.array([w for r in rows for _, w in r], dtype=np.int32))
    shards.write_vectors(out, list(vocab), [[(list(docs), vectors)]],
                          model={"name": model.name, "sha256": model.sha256},
                          encoder={"query_max_length": query_max_length}, scale=scale)
    return out


def query_terms(model, count: int) -> list[str]:
    """The `count` terms that the sample queries weigh most, in order: documents made of them match."""
    from lsr_index.inputs.topics import read_queries
    from lsr_index.model.encoder import SpladeEncoder
    from lsr_index.search import encode_queries
    from lsr_index.vectors.quantize import Quantization

    totals: dict[str, int] = {}
    for _, vector in encode_queries(SpladeEncoder(model), Quantization(scale=100.0),
                                    read_queries(SAMPLE / "queries.tsv"), 64):
        for term, weight in vector.items():
            totals[term] = totals.get(term, 0) + weight
    return sorted(totals, key=lambda t: (-totals[t], t))[:count]


def random_docs(terms: list[str], docs: int, per_doc: int, max_impact: int, seed: int) -> dict[str, dict[str, int]]:
    rng = np.random.default_rng(seed)
    return {f"d{i}": {terms[t]: int(w) for t, w in zip(rng.choice(len(terms), per_doc, replace=False),
                                                      rng.integers(1, max_impact, per_doc))}
            for i in range(docs)}


def build(vectors: Path, index: Path) -> Path:
    from lsr_index.engines.lucene.build import build_index

    build_index(vectors, index, heap="1g", progress=False)
    return index
