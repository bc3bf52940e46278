"""Quantization against a NumPy reference, and CSR reassembly from length-sorted sub-batches."""

from __future__ import annotations

import numpy as np
import torch

from lsr_index.vectors.quantize import Quantization, SparseVectors, quantize


def _reference(w: np.ndarray, q: Quantization) -> list[dict[int, int]]:
    rows = []
    for row in w:
        row = np.where(row >= q.min_weight, row, 0.0)
        if q.top_k is not None:
            keep = np.argsort(-row, kind="stable")[: q.top_k]
            row = np.where(np.isin(np.arange(len(row)), keep), row, 0.0)
        impacts = np.round(row.astype(np.float32) * np.float32(q.scale))
        rows.append({int(i): int(impacts[i]) for i in np.flatnonzero(impacts)})
    return rows


def _as_dicts(v: SparseVectors) -> list[dict[int, int]]:
    return [dict(zip(*(a.tolist() for a in v.row(i)))) for i in range(len(v))]


def test_quantize_matches_reference(seed):
    rng = np.random.default_rng(seed)
    w = np.maximum(rng.normal(size=(7, 513)), 0).astype(np.float32) * 3  # distinct values: no topk ties
    for q in (Quantization(), Quantization(scale=51.2), Quantization(top_k=10), Quantization(min_weight=1.0)):
        got = quantize(torch.from_numpy(w), q)
        assert _as_dicts(got) == _reference(w, q)
        assert got.weights.dtype == np.int32 and (got.weights > 0).all()
        assert all(np.all(np.diff(got.row(i)[0]) > 0) for i in range(len(got)))


def test_tiny_weights_round_to_nothing_and_empty_rows_survive():
    w = torch.tensor([[0.004, 0.0, 0.006], [0.0, 0.0, 0.0]])
    v = quantize(w, Quantization(scale=100))
    assert _as_dicts(v) == [{2: 1}, {}]


def test_stack_restores_input_order(seed):
    rng = np.random.default_rng(seed)
    w = np.maximum(rng.normal(size=(11, 64)), 0).astype(np.float32)
    order = rng.permutation(11)
    parts = [(order[i:i + 4], quantize(torch.from_numpy(w[order[i:i + 4]]), Quantization()))
             for i in range(0, 11, 4)]
    assert _as_dicts(SparseVectors.stack(parts, 11)) == _as_dicts(quantize(torch.from_numpy(w), Quantization()))

