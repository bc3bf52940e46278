"""SPLADE max pooling on CPUs with int8 dot-product instructions: an int8 screen, then float32 where it matters.

On such CPUs (AVX512-VNNI, AVX-VNNI, AMX) an int8 matmul runs at several times the float32 rate, well above bf16's
(docs/performance/encode.md, "CPU"), and the head's matmul is nearly all of a small model's work. A SPLADE vector keeps
only the terms whose pooled logit is positive (~250 of 30,522 for splade-tiny on SciFact), so the screen need only say
which terms might be: each (document, term) pair gets a proven upper bound on its pooled logit, every pair whose bound
is at most zero is exactly 0 after the activation, and the rest (~475 a document) are recomputed in float32 from that
document's tokens: no pair is dropped that the float32 path keeps. (Values are float32's up to its rounding, which the
recomputation, over fewer terms, may do in another order.) When the screen keeps too much to pay (an untrained head,
~all terms positive), the caller runs the plain float32 path instead.

The bound. Each document d's tokens share one scale s_d (their largest |component| / 127) and each term row v has
its own s_v: h_t = s_d·q_t + e_t and w_v = s_v·p_v + f_v with q, p int8 and e, f the exact residuals. Then
h_t·w_v = s_d·s_v·(q_t·p_v) + s_d·q_t·f_v + e_t·w_v, and by Cauchy-Schwarz the pooled logit is at most
s_d·s_v·max_t(q_t·p_v) + max_t‖s_d·q_t‖·‖f_v‖ + max_t‖e_t‖·‖w_v‖ + b_v. To it is added γ_H·max_t‖h_t‖·‖w_v‖
(γ_H = H·2^-24 / (1 - H·2^-24)): the float32 path's dot products, in any order, are off by at most that, so a pair
its rounding makes positive is kept too. Where ‖h‖·‖w‖ or a bias nears float32's range (its sums may overflow
there) the screen steps aside. A recomputed logit within rounding of zero may still land on the other side of it
than the float32 path's did, as any change of summation order may.

The integer dot products are exact (int32: H·127² < 2^31 for H < 133,000); as the scale is shared within a
document, their max is taken before scaling (in float32: exact up to H = 1,040, its rounding covered beyond). The
rest is computed in float64 from the float32 values (the products s·q are exact there); its rounding (relative
~H·2^-53) is covered by widening the norms' terms by 2^-14 and the rest by 2^-50 of its size. On SciFact the screen
keeps ~475 pairs a document, against ~364 for a bf16 screen with its rounding bound and ~253 truly positive: the
recomputation is ~2 % of the screen's arithmetic either way.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from .activations import activate

_DENSE = 1 / 8  # past this share of (document, term) pairs kept, the screen costs more than the float32 path
_WIDE = 1 + 2.0**-14  # covers the float64 norms' rounding
_LIFT = 2.0**-50  # covers the float64 products' rounding, relative to their size
_LIFT_TOP = 2.0**-22  # covers the int32 sums' conversion to float32 (exact below 2^24, i.e. H ≤ 1,040) and the above
_MAX_HIDDEN = (2**31 - 1) // 127**2  # int32 accumulation stays exact below this
_FLOAT32_SAFE = 2.0**126  # past this, the float32 path's logits may overflow: it answers instead

# One step's int32 logits block, [tokens, vocabulary]: 2,048 × 512 (4 MiB) stays in cache between the matmul and the
# max that reads it (the float32 path's block, reference.py)
_BLOCK_TOKENS = 2048
_BLOCK_VOCAB = 512


def available() -> bool:
    """Whether this CPU multiplies int8 natively (otherwise an int8 matmul is no faster than float32's). The probe
    and `torch._int_mm` are private to torch: a torch without them gets the float32 path, not an error."""
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    return hasattr(torch, "_int_mm") and probe is not None and probe()


def _quantized(rows: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """rows [N, H] float32 over their scales [N] → int8 q, ‖scale·q‖ and ‖rows − scale·q‖ (float64, exact inputs)."""
    q = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    approx = scale.double()[:, None] * q.double()
    return q, torch.linalg.vector_norm(approx, dim=1), torch.linalg.vector_norm(rows.double() - approx, dim=1)


def _row_scales(largest: Tensor) -> Tensor:
    """largest |component| → int8 scale; rows of zeros (or underflowing to them) get 1."""
    scale = largest / 127
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _largest(values: Tensor) -> float:
    """The largest value, 0 for none (NaN propagates: every comparison with it is false)."""
    return float(values.max()) if values.numel() else 0.0


class _Terms(NamedTuple):
    """The weight's int8 rows and what the bound needs of them: made once per weight (tens of milliseconds for
    splade-tiny's 30,522 × 128, which every call of a small batch would otherwise pay again)."""

    q: Tensor  # int8 [V, H]
    scale: Tensor  # float32 [V]
    norm: Tensor  # float64 [V]: ‖w_v‖
    error: Tensor  # float64 [V]: ‖w_v − scale_v·q_v‖


_terms: dict[int, tuple[weakref.ref, tuple, _Terms]] = {}  # id(weight) → (the weight, its state, _Terms)


def _quantized_terms(weight: Tensor) -> _Terms:
    """Kept per weight tensor while its state stays: storage, layout and version (bumped by every in-place change
    PyTorch counts on this tensor; writes through `.data`, a NumPy view or another tensor set to its storage are not
    counted, as autograd's checks miss them too). An inference tensor has no version: quantized at each call."""
    inference = weight.is_inference()
    state = (weight.data_ptr(), weight.shape, weight.stride(), weight.dtype, None if inference else weight._version)
    kept = _terms.get(id(weight))
    if kept is not None and kept[0]() is weight and kept[1] == state and not inference:
        return kept[2]
    rows = weight.float()
    scale = _row_scales(rows.abs().amax(1))
    q, _, error = _quantized(rows, scale)
    terms = _Terms(q, scale, torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64), error)
    if not inference:
        key = id(weight)
        _terms[key] = weakref.ref(weight, lambda _: _terms.pop(key, None)), state, terms
    return terms


def screened_max_pool(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                      activation: str) -> Tensor | None:
    """w[d, v] = activate(max over {t: doc_ids[t] = d} of tokens[t] · weight[v] + bias[v]); 0 for an empty d.

    tokens [T, H] grouped by document in ascending doc_ids order (packed or unpadded rows), weight [V, H];
    returns float32 [n_docs, V], or None when more than _DENSE of the pairs could be nonzero (or H is too large
    for exact int32 sums).
    """
    n_vocab = weight.shape[0]
    keep = candidates(tokens, doc_ids, n_docs, weight, bias)
    if keep is None:
        return None
    pairs = keep.nonzero()
    if pairs.shape[0] > _DENSE * n_docs * n_vocab:
        return None
    # pass 2: the kept pairs in float32, document by document
    tokens, weight = tokens.float(), weight.float()
    bias = bias.float() if bias is not None else torch.zeros(n_vocab)
    counts = torch.bincount(doc_ids, minlength=n_docs)
    out = torch.zeros(n_docs, n_vocab, dtype=torch.float32)
    per_doc = torch.bincount(pairs[:, 0], minlength=n_docs).tolist()
    terms = pairs[:, 1].split(per_doc)
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    for d, (start, count) in enumerate(zip(starts, counts.tolist())):
        if per_doc[d]:
            kept = terms[d]
            logits = torch.mm(tokens[start : start + count], weight[kept].T).amax(0) + bias[kept]
            out[d, kept] = activate(logits, activation)
    return out


def candidates(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """Pass 1 of `screened_max_pool`: bool [n_docs, V], False only where the bound proves the pooled logit ≤ 0 in
    every float32 summation order; None where the bound does not apply (H too large, values near float32's range)."""
    n_tokens, hidden = tokens.shape
    n_vocab = weight.shape[0]
    if hidden > _MAX_HIDDEN:
        return None
    terms = _quantized_terms(weight)
    tokens = tokens.float()
    bias = bias.float() if bias is not None else torch.zeros(n_vocab)
    counts = torch.bincount(doc_ids, minlength=n_docs)
    # pass 1: the pooled int8 logits per (document, term), and which pairs the bound cannot rule out
    largest = torch.zeros(n_docs).scatter_reduce_(0, doc_ids, tokens.abs().amax(1), "amax")  # NaN propagates
    doc_scale = _row_scales(largest)
    q_tokens, approx_norm, error_norm = _quantized(tokens, doc_scale[doc_ids])
    doc_approx = torch.zeros(n_docs, dtype=torch.float64).scatter_reduce_(0, doc_ids, approx_norm, "amax")[:, None]
    doc_error = torch.zeros(n_docs, dtype=torch.float64).scatter_reduce_(0, doc_ids, error_norm, "amax")[:, None]
    bias_up = bias.double() + _LIFT * bias.double().abs()
    doc_scale = doc_scale.double()[:, None]
    # the float32 path's own rounding: its dot products (in any order) are off by at most γ_H·Σ|h_i·w_i| ≤
    # γ_H·‖h‖·‖w‖, so a pair it makes positive while the exact logit is not must be kept too; and where ‖h‖·‖w‖ or
    # a bias nears float32's range its sums overflow to inf or NaN, which this bound does not model: the float32
    # path answers
    doc_norm = doc_approx + doc_error  # ≥ max_t ‖h_t‖ (triangle inequality)
    if _largest(doc_norm) * _largest(terms.norm) >= _FLOAT32_SAFE or \
            _largest(bias[torch.isfinite(bias)].abs()) >= _FLOAT32_SAFE:
        return None
    gamma = hidden * 2.0**-24 / (1 - hidden * 2.0**-24)
    keep = torch.empty(n_docs, n_vocab, dtype=torch.bool)
    pooled = torch.empty(n_docs, min(n_vocab, _BLOCK_VOCAB))
    block = torch.empty(min(n_tokens, _BLOCK_TOKENS), pooled.shape[1])
    for v0 in range(0, n_vocab, _BLOCK_VOCAB):
        columns = terms.q[v0 : v0 + _BLOCK_VOCAB].T  # [H, chunk], column-major: the layout the int8 kernel reads
        chunk = columns.shape[1]
        acc = pooled[:, :chunk]
        acc.fill_(float("-inf"))
        for t0 in range(0, n_tokens, _BLOCK_TOKENS):
            # PyTorch's max scatter over int32 runs far slower than over float32 on CPU: the sums are converted first
            integers = torch._int_mm(q_tokens[t0 : t0 + _BLOCK_TOKENS], columns)
            logits = block[: integers.shape[0], :chunk].copy_(integers)
            ids = doc_ids[t0 : t0 + _BLOCK_TOKENS]
            acc.scatter_reduce_(0, ids[:, None].expand_as(logits), logits, "amax")
        top = acc.double() * doc_scale * terms.scale[v0 : v0 + chunk].double()
        spread = (doc_error * terms.norm[v0 : v0 + chunk] + doc_approx * terms.error[v0 : v0 + chunk]
                  + gamma * doc_norm * terms.norm[v0 : v0 + chunk]) * _WIDE
        upper = top + _LIFT_TOP * top.abs() + spread + bias_up[v0 : v0 + chunk]
        # not (upper ≤ 0) rather than upper > 0: a NaN (from a NaN token or weight) is kept, and recomputed as the
        # float32 path would
        torch.logical_not(upper <= 0, out=keep[:, v0 : v0 + chunk])
    keep[counts == 0] = False  # an empty document weighs 0, as in the float32 path
    return keep
