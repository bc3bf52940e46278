"""Plain-PyTorch SPLADE pooling: the CPU fallback, the sum-pooling path and the test oracle.

It never builds the full [B, L, V] logits: the vocabulary is walked in chunks, each reduced before the next.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements of one [tokens, chunk] logits block: 2**26 fp32 values = 256 MB at most.
_CHUNK_ELEMS = 1 << 26

# What a token's logit x becomes before pooling. SPLADE's is log1p(relu(x)); the opensearch v3 models (through
# sentence-transformers' SpladePooling(activation_function="log1p_relu")) apply log1p once more.
ACTIVATIONS = ("log1p_relu", "log1p_log1p_relu")
POOLINGS = ("max", "sum")


def activate(x: Tensor, activation: str) -> Tensor:
    y = torch.log1p(torch.relu(x))
    return torch.log1p(y) if activation == "log1p_log1p_relu" else y


def check_options(pooling: str, activation: str) -> None:
    if pooling not in POOLINGS or activation not in ACTIVATIONS:
        raise ValueError(f"sparton: pooling must be one of {POOLINGS} and activation one of {ACTIVATIONS}, "
                         f"got {pooling!r}, {activation!r}")


def _segment_pool(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                  pooling: str, activation: str) -> Tensor:
    """w[d, v] = pool over {t: doc_ids[t] = d} of activate(tokens[t] · weight[v] + bias[v]); 0 for empty d.

    Max pooling reduces the raw logits and activates once (the activations are monotone); sum pooling activates
    every token. Computes in float64 when the inputs are float64 (the oracle), in float32 otherwise.
    """
    check_options(pooling, activation)
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    tokens = tokens.to(dtype)
    n_vocab = weight.shape[0]
    out = torch.empty(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    chunk = max(1, _CHUNK_ELEMS // max(1, tokens.shape[0]))
    for v0 in range(0, n_vocab, chunk):
        logits = tokens @ weight[v0 : v0 + chunk].to(dtype).T  # [T, chunk]
        if pooling == "sum":
            if bias is not None:
                logits += bias[v0 : v0 + chunk].to(dtype)
            total = torch.zeros((n_docs, logits.shape[1]), dtype=dtype, device=tokens.device)
            out[:, v0 : v0 + chunk] = total.index_add_(0, doc_ids, activate(logits, activation)).float()
            continue
        peak = torch.full((n_docs, logits.shape[1]), float("-inf"), dtype=dtype, device=tokens.device)
        peak.scatter_reduce_(0, doc_ids[:, None].expand_as(logits), logits, "amax")
        if bias is not None:
            peak += bias[v0 : v0 + chunk].to(dtype)
        # relu maps the -inf of a document with no kept token to 0, so such a row comes out all zeros.
        out[:, v0 : v0 + chunk] = activate(peak, activation).float()
    return out


def splade_max_reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor, *,
                         pooling: str = "max", activation: str = "log1p_relu") -> Tensor:
    """Padded SPLADE pooling. hidden [B, L, H], weight [V, H], bias [V] or None, mask [B, L]
    (nonzero = keep); returns float32 [B, V]."""
    batch, seq, _ = hidden.shape
    keep = mask.reshape(batch, seq) != 0
    doc_ids = torch.arange(batch, device=hidden.device).repeat_interleave(seq).reshape(batch, seq)
    return _segment_pool(hidden[keep], doc_ids[keep], batch, weight, bias, pooling, activation)


def splade_max_packed_reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor, *,
                                pooling: str = "max", activation: str = "log1p_relu") -> Tensor:
    """Packed SPLADE pooling. hidden [T, H], cu_seqlens [B+1] document offsets; returns float32 [B, V]."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    doc_ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device), lengths)
    return _segment_pool(hidden[: doc_ids.numel()], doc_ids, lengths.numel(), weight, bias, pooling, activation)
