"""Plain-PyTorch SPLADE pooling: the CPU fallback, the sum-pooling path and the test oracle (in float64).

It never builds the full [B, L, V] logits: the vocabulary is walked in chunks, each reduced before the next.
Max pooling of float32/bf16/fp16 inputs on a CPU with int8 dot-product instructions goes through
`cpu_head`'s int8 screen instead (the same result, its head at about a third of the time).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import cpu_head
from .activations import activate, check_options

# One step's logits block, [tokens, vocabulary] = 2,048 × 512 (4 MiB in float32): small enough to stay in cache
# between the matmul that writes it and the reduction that reads it. On 2 CPU cores (AVX-512, MKL) the head ran at
# 176 GFLOP/s this way against 77 with [all tokens, 2^26 / tokens] blocks, which went out to memory and back.
# On a GPU the limit is launches, not cache: blocks of up to 2^26 elements (256 MB in float32).
_BLOCK_TOKENS = 2048
_BLOCK_VOCAB = 512
_GPU_BLOCK_ELEMS = 1 << 26


def _block_shape(n_tokens: int, device: torch.device) -> tuple[int, int]:
    """(tokens, vocabulary entries) of one step's logits block."""
    if device.type == "cpu":
        return _BLOCK_TOKENS, _BLOCK_VOCAB
    n_tokens = max(1, n_tokens)
    return n_tokens, max(1, _GPU_BLOCK_ELEMS // n_tokens)

def _segment_pool(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                  pooling: str, activation: str) -> Tensor:
    """w[d, v] = pool over {t: doc_ids[t] = d} of activate(tokens[t] · weight[v] + bias[v]); 0 for empty d.

    Max pooling reduces the raw logits and activates once (the activations are monotone); sum pooling activates
    every token. Computes in float64 when the inputs are float64 (the oracle), in float32 otherwise.
    """
    check_options(pooling, activation)
    if pooling == "max" and tokens.dtype != torch.float64 and tokens.device.type == "cpu" and cpu_head.available():
        screened = cpu_head.screened_max_pool(tokens, doc_ids, n_docs, weight, bias, activation)
        if screened is not None:  # None: too many terms may be nonzero for the screen to pay
            return screened
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    tokens = tokens.to(dtype)
    n_tokens, n_vocab = tokens.shape[0], weight.shape[0]
    out = torch.empty(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    step_tokens, step_vocab = _block_shape(n_tokens, tokens.device)
    block = torch.empty(min(n_tokens, step_tokens), min(n_vocab, step_vocab), dtype=dtype, device=tokens.device)
    pooled = torch.empty(n_docs, block.shape[1], dtype=dtype, device=tokens.device)
    for v0 in range(0, n_vocab, step_vocab):
        columns = weight[v0 : v0 + step_vocab].to(dtype).T  # [H, chunk]
        chunk = columns.shape[1]
        acc = pooled[:, :chunk]
        acc.fill_(0.0 if pooling == "sum" else float("-inf"))
        for t0 in range(0, n_tokens, step_tokens):
            rows = tokens[t0 : t0 + step_tokens]
            logits = torch.mm(rows, columns, out=block[: rows.shape[0], :chunk])
            ids = doc_ids[t0 : t0 + step_tokens]
            if pooling == "sum":
                if bias is not None:
                    logits += bias[v0 : v0 + chunk].to(dtype)
                acc.index_add_(0, ids, activate(logits, activation))
            else:
                acc.scatter_reduce_(0, ids[:, None].expand_as(logits), logits, "amax")
        if pooling == "sum":
            out[:, v0 : v0 + chunk] = acc
            continue
        if bias is not None:
            acc += bias[v0 : v0 + chunk].to(dtype)
        # relu maps the -inf of a document with no kept token to 0, so such a row comes out all zeros.
        out[:, v0 : v0 + chunk] = activate(acc, activation)
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
