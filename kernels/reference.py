"""Plain-PyTorch SPLADE max pooling: the CPU fallback and the test oracle.

It never builds the full [B, L, V] logits: the vocabulary is walked in chunks, each reduced before the next.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements of one [tokens, chunk] logits block: 2**26 fp32 values = 256 MB at most.
_CHUNK_ELEMS = 1 << 26


def _segment_max(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None) -> Tensor:
    """w[d, v] = log1p(relu(max_{t: doc_ids[t] = d} tokens[t] · weight[v] + bias[v])); 0 for empty d.

    Computes in float64 when the inputs are float64 (the oracle), in float32 otherwise.
    """
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    tokens = tokens.to(dtype)
    n_vocab = weight.shape[0]
    out = torch.empty(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    chunk = max(1, _CHUNK_ELEMS // max(1, tokens.shape[0]))
    for v0 in range(0, n_vocab, chunk):
        logits = tokens @ weight[v0 : v0 + chunk].to(dtype).T  # [T, chunk]
        peak = torch.full((n_docs, logits.shape[1]), float("-inf"), dtype=dtype, device=tokens.device)
        peak.scatter_reduce_(0, doc_ids[:, None].expand_as(logits), logits, "amax")
        if bias is not None:
            peak += bias[v0 : v0 + chunk].to(dtype)
        # relu maps the -inf of a document with no kept token to 0, so such a row comes out all zeros.
        out[:, v0 : v0 + chunk] = torch.log1p(torch.relu(peak)).float()
    return out


def splade_max_reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor) -> Tensor:
    """Padded SPLADE max pooling. hidden [B, L, H], weight [V, H], bias [V] or None, mask [B, L]
    (nonzero = keep); returns float32 [B, V]."""
    batch, seq, _ = hidden.shape
    keep = mask.reshape(batch, seq) != 0
    doc_ids = torch.arange(batch, device=hidden.device).repeat_interleave(seq).reshape(batch, seq)
    return _segment_max(hidden[keep], doc_ids[keep], batch, weight, bias)


def splade_max_packed_reference(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor
) -> Tensor:
    """Packed SPLADE max pooling. hidden [T, H], cu_seqlens [B+1] document offsets; returns float32 [B, V]."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    doc_ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device), lengths)
    return _segment_max(hidden[: doc_ids.numel()], doc_ids, lengths.numel(), weight, bias)
