"""Float SPLADE weights → integer impacts, compacted to CSR on the device before crossing to the host.

Impacts are round(w × scale). Scale 100 is the Anserini/naver convention for SPLADE impact indexes
(Pyserini's own encoder uses 256/5 = 51.2); it is recorded in every manifest because queries and
documents must share it. Rounding drops weights under 0.5/scale, which is what makes the vectors sparse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from lsr_index.errors import LsrIndexError
from lsr_index.settings import DEFAULTS, check

if TYPE_CHECKING:  # torch is imported where vectors are quantized: reading a manifest must not load it
    import torch

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Quantization:
    scale: float = DEFAULTS["scale"]
    top_k: int | None = DEFAULTS["top_k"]  # keep at most this many terms per vector (pruning), None: all
    min_weight: float = DEFAULTS["min_weight"]  # drop float weights below this before rounding

    def __post_init__(self) -> None:
        for name in ("scale", "top_k", "min_weight"):
            check(name, getattr(self, name))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: object, origin: str) -> Quantization:
        """From a manifest or index record: unknown keys and bad values are refused, not passed on."""
        names = {f.name for f in fields(cls)}
        if not isinstance(body, dict) or not set(body) <= names or "scale" not in body:
            raise LsrIndexError(f"{origin}: expected an object with 'scale' and optionally 'top_k', 'min_weight'")
        for name, value in body.items():
            check(name, value, origin)
        return cls(**body)


@dataclass
class SparseVectors:
    """Rows of integer impacts in CSR form: row i is terms[indptr[i]:indptr[i+1]] with its weights."""

    indptr: np.ndarray  # int64 [n + 1]
    terms: np.ndarray  # int32 [nnz], ascending within a row
    weights: np.ndarray  # int32 [nnz], > 0

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.indptr[i], self.indptr[i + 1]
        return self.terms[lo:hi], self.weights[lo:hi]

    def rows(self, lo: int, hi: int) -> SparseVectors:
        """Rows [lo, hi) as vectors of their own (views of this one's arrays)."""
        a, b = self.indptr[lo], self.indptr[hi]
        return SparseVectors(self.indptr[lo:hi + 1] - a, self.terms[a:b], self.weights[a:b])

    @staticmethod
    def stack(parts: Sequence[tuple[np.ndarray, SparseVectors]], n: int) -> SparseVectors:
        """Reassemble sub-batches encoded out of order (length-sorted) into input order 0..n-1."""
        positions = np.concatenate([p for p, _ in parts]) if parts else np.zeros(0, np.int64)
        lengths = np.concatenate([np.diff(v.indptr) for _, v in parts]) if parts else np.zeros(0, np.int64)
        starts = np.concatenate([v.indptr[:-1] + off for (_, v), off in
                                 zip(parts, np.cumsum([0] + [v.nnz for _, v in parts[:-1]]))]) \
            if parts else np.zeros(0, np.int64)
        if len(positions) != n or (n and not np.array_equal(np.sort(positions), np.arange(n))):
            raise ValueError("sub-batches do not cover the batch exactly once")
        order = np.argsort(positions, kind="stable")
        lengths, starts = lengths[order], starts[order]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        # gather index of every nonzero: its row's source start plus its offset inside the row
        src = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        terms = np.concatenate([v.terms for _, v in parts]) if parts else np.zeros(0, np.int32)
        weights = np.concatenate([v.weights for _, v in parts]) if parts else np.zeros(0, np.int32)
        return SparseVectors(indptr, terms[src], weights[src])


def quantize(weights: torch.Tensor, q: Quantization) -> SparseVectors:
    """[n, V] float weights (any device) → integer CSR on the host; only nonzeros are transferred."""
    import torch

    w = weights.float()
    if q.min_weight > 0:
        w = torch.where(w >= q.min_weight, w, torch.zeros((), device=w.device))
    if q.top_k is not None and q.top_k < w.shape[1]:
        values, index = w.topk(q.top_k, dim=1)
        w = torch.zeros_like(w).scatter_(1, index, values)
    scaled = torch.round(w * q.scale)
    rows, cols = scaled.nonzero(as_tuple=True)  # row-major: terms ascend within each row; NaN counts as nonzero
    values = scaled[rows, cols]
    bad = (~torch.isfinite(values) | (values > INT32_MAX)).any()  # checked before the cast wraps
    counts = torch.bincount(rows, minlength=w.shape[0])
    # one transfer (one wait) for everything the host needs: [bad, counts (n), terms (nnz), impacts (nnz)]
    host = torch.cat([bad.view(1).int(), counts.int(), cols.int(),
                      values.nan_to_num(0.0, posinf=0.0).clamp(max=INT32_MAX).int()]).cpu().numpy()
    if host[0]:
        raise LsrIndexError("impacts overflow int32, or the weights hold NaN/inf (a bf16 overflow?): lower --scale "
                            "or encode in float32")
    n, nnz = w.shape[0], len(cols)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(host[1:1 + n], out=indptr[1:])
    return SparseVectors(indptr, host[1 + n:1 + n + nnz], host[1 + n + nnz:])  # views of the one transfer
