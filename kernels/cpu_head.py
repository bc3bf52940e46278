"""SPLADE max pooling on CPUs with bfloat16 dot-product instructions: a bf16 screen, then float32 where it matters.

On such CPUs (AVX512-BF16, AMX) a bf16 matmul runs at about twice the float32 rate (2 cores of an AMD EPYC:
355 against 176 GFLOP/s for [2048, 128] × [128, 512]), and the head's matmul is nearly all of a small model's
work. A SPLADE vector keeps only the terms whose pooled logit is positive (~250 of 30,522 for splade-tiny on
SciFact), so the bf16 logits need only say which terms might be: each bf16 logit comes with a proven error
bound, every (document, term) pair whose bound keeps it at or below zero is exactly 0 after the activation, and
the rest (~350 a document) are recomputed in float32 from that document's tokens: no pair is dropped that the
float32 path keeps, at ~0.5× its time. (Values are float32's up to its rounding, which the recomputation, over
fewer terms, may do in another order.) When the screen keeps too much to pay (an untrained head, ~all terms
positive), the caller runs the plain float32 path instead.

The bound, for a logit s = h·w + b with h, w of H < 2^24 float32 components: rounding h and w to bf16 (unit
roundoff u = 2^-8) moves each product by at most (2u + u²)|h_i w_i|; the products of bf16 numbers are exact in
float32 and their sum in float32, in any order, adds at most γ_H = H·2^-24 / (1 - H·2^-24) of Σ|h_i w_i|; the
result rounded to bf16 moves by at most u/(1 - u) of itself. With Σ|h_i w_i| ≤ ‖h‖‖w‖ (Cauchy-Schwarz), the true
max over a document's tokens is at most g(max of the bf16 logits) + C·max‖h‖·‖w‖ with g(a) = a + u/(1-u)·|a|
(increasing, so it commutes with the max). The dot-product instructions read subnormal inputs as 0 (each such
product is off by < 2^-126·|other factor|: at most 2^-126·√H·(‖h‖ + ‖w‖) in all) and flush subnormal products
(< H·2^-126 in all: the 1e-30 slack). The norms and the bound are computed in float64 from the float32 values
(no underflow, relative error ~H·2^-53, covered by widening C by 2^-14 and the sum by 2^-50 of its terms).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import reference

_U = 2.0**-8  # bfloat16's unit roundoff (8 significant bits, round to nearest)
_U32 = 2.0**-24
_SLACK = 1e-30  # covers products of bf16 numbers flushed to zero as subnormals
_DENSE = 1 / 8  # past this share of (document, term) pairs kept, the screen costs more than the float32 path

# One step's bf16 logits block, [tokens, vocabulary]: on 2 cores blocks from 1,024 × 1,024 to 2,048 × 2,048 ran
# within 10 % of each other; 2,048 × 512 (2 MiB) was the fastest
_BLOCK_TOKENS = 2048
_BLOCK_VOCAB = 512


def available() -> bool:
    """Whether this CPU multiplies bf16 natively (otherwise a bf16 matmul is slower than float32's). The probes are
    private to torch: a torch without them gets the float32 path, not an error."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return torch.backends.mkldnn.is_available() and any(probe is not None and probe() for probe in probes)


def screened_max_pool(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                      activation: str) -> Tensor | None:
    """w[d, v] = activate(max over {t: doc_ids[t] = d} of tokens[t] · weight[v] + bias[v]); 0 for an empty d.

    tokens [T, H] grouped by document in ascending doc_ids order (packed or unpadded rows), weight [V, H];
    returns float32 [n_docs, V], or None when more than _DENSE of the pairs could be nonzero.
    """
    n_tokens, hidden = tokens.shape
    n_vocab = weight.shape[0]
    tokens, weight = tokens.float(), weight.float()
    bias = bias.float() if bias is not None else torch.zeros(n_vocab)
    counts = torch.bincount(doc_ids, minlength=n_docs)
    # pass 1: the bf16 logits' max per (document, term), and which pairs the bound cannot rule out
    screen_tokens, screen_weight = tokens.bfloat16(), weight.bfloat16()
    token_norm = torch.linalg.vector_norm(tokens, dim=1, dtype=torch.float64)
    doc_norm = torch.zeros(n_docs, dtype=torch.float64).scatter_reduce_(0, doc_ids, token_norm, "amax")[:, None]
    term_norm = torch.linalg.vector_norm(weight, dim=1, dtype=torch.float64)
    gamma = hidden * _U32 / (1 - hidden * _U32)
    spread = (2 * _U + _U * _U + gamma * (1 + _U) ** 2) * (1 + 2.0**-14) * doc_norm
    lift = _U / (1 - _U) + 2.0**-50
    bias_up = bias.double() + 2.0**-50 * bias.double().abs()
    subnormal = 2.0**-126 * hidden**0.5
    keep = torch.empty(n_docs, n_vocab, dtype=torch.bool)
    block = torch.empty(min(n_tokens, _BLOCK_TOKENS), min(n_vocab, _BLOCK_VOCAB), dtype=torch.bfloat16)
    pooled = torch.empty(n_docs, block.shape[1], dtype=torch.bfloat16)
    for v0 in range(0, n_vocab, _BLOCK_VOCAB):
        columns = screen_weight[v0 : v0 + _BLOCK_VOCAB].T
        chunk = columns.shape[1]
        acc = pooled[:, :chunk]
        acc.fill_(float("-inf"))
        for t0 in range(0, n_tokens, _BLOCK_TOKENS):
            rows = screen_tokens[t0 : t0 + _BLOCK_TOKENS]
            logits = torch.mm(rows, columns, out=block[: rows.shape[0], :chunk])
            ids = doc_ids[t0 : t0 + _BLOCK_TOKENS]
            acc.scatter_reduce_(0, ids[:, None].expand_as(logits), logits, "amax")
        top = acc.double()
        norms = term_norm[v0 : v0 + chunk]
        upper = top + lift * top.abs() + spread * norms + subnormal * (norms + doc_norm) + bias_up[v0 : v0 + chunk]
        # not (upper ≤ 0) rather than upper > 0: a NaN (from a NaN token or weight) is kept, and recomputed as the
        # float32 path would
        torch.logical_not(upper + _SLACK <= 0, out=keep[:, v0 : v0 + chunk])
    keep[counts == 0] = False  # an empty document weighs 0, as in the float32 path
    pairs = keep.nonzero()
    if pairs.shape[0] > _DENSE * n_docs * n_vocab:
        return None
    # pass 2: the kept pairs in float32, document by document
    out = torch.zeros(n_docs, n_vocab, dtype=torch.float32)
    per_doc = torch.bincount(pairs[:, 0], minlength=n_docs).tolist()
    terms = pairs[:, 1].split(per_doc)
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    for d, (start, count) in enumerate(zip(starts, counts.tolist())):
        if per_doc[d]:
            kept = terms[d]
            logits = torch.mm(tokens[start : start + count], weight[kept].T).amax(0) + bias[kept]
            out[d, kept] = reference.activate(logits, activation)
    return out
