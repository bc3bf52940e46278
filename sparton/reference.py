"""Plain-PyTorch SPLADE pooling: the CPU fallback, the sum-pooling path and the test oracle (in float64).

It never builds the full [B, L, V] logits: the vocabulary is walked in chunks, each reduced before the next.
Max pooling of float32/bf16/fp16 inputs on a CPU with int8 dot-product instructions goes through
`cpu_head`'s int8 screen instead (the same result, its head at about a third of the time).

Differentiable: when a gradient is needed, max pooling runs `_SegmentMax`, which also records each (document, term)'s
argmax token (the lowest row among equal maxima, as the Triton kernel's tie rule) and whose backward builds the
[tokens, vocabulary] gradient S block by block from it (S[t, v] = g[d, v] where t is (d, v)'s argmax) and takes
dH = S·W, dW = Sᵀ·H: the sums the Triton backward computes (dW as gathers, dH as a one-hot product);
sum pooling runs plain autograd, each vocabulary chunk recomputed in the backward (torch.utils.checkpoint).
Outputs are float32, float64 for float64 inputs (the oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from . import cpu_head
from .activations import activate, check_options

# One step's logits block, [tokens, vocabulary] = 2,048 × 512 (4 MiB in float32): small enough to stay in cache
# between the matmul that writes it and the reduction that reads it; [all tokens, 2^26 / tokens] blocks go out to
# memory and back, at about half the rate (docs/performance/encode.md, "CPU").
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


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _segment_pool(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                  pooling: str, activation: str) -> Tensor:
    """w[d, v] = pool over {t: doc_ids[t] = d} of activate(tokens[t] · weight[v] + bias[v]); 0 for empty d.

    Max pooling reduces the raw logits and activates once (the activations are monotone); sum pooling activates
    every token. Computes in float64 when the inputs are float64 (the oracle), in float32 otherwise.
    """
    check_options(pooling, activation)
    if _needs_grad(tokens, weight, bias):
        if pooling == "max":
            return _SegmentMax.apply(tokens, weight, bias, doc_ids, n_docs, activation)
        return _segment_sum_grad(tokens, doc_ids, n_docs, weight, bias, activation)
    if pooling == "max" and tokens.dtype != torch.float64 and tokens.device.type == "cpu" and cpu_head.available():
        screened = cpu_head.screened_max_pool(tokens, doc_ids, n_docs, weight, bias, activation)
        if screened is not None:  # None: too many terms may be nonzero for the screen to pay
            return screened
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    tokens = tokens.to(dtype)
    n_tokens, n_vocab = tokens.shape[0], weight.shape[0]
    out = torch.empty(n_docs, n_vocab, dtype=_out_dtype(dtype), device=tokens.device)
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


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _slope(out: Tensor, activation: str) -> Tensor:
    """act'(pre) from the output w = act(pre): 0 where relu cut (w = 0); log1p'(x) = 1/(1+x) = e^-w; for
    log1p(log1p(relu)) also 1/(1+u), u = e^w - 1."""
    slope = torch.exp(-(out + torch.expm1(out))) if activation == "log1p_log1p_relu" else torch.exp(-out)
    return torch.where(out > 0, slope, torch.zeros_like(slope))


def _segment_max_argmax(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                        activation: str) -> tuple[Tensor, Tensor]:
    """(w [n_docs, V], argmax int64 [n_docs, V]): w as `_segment_pool`'s max pooling; argmax the lowest row t with
    doc_ids[t] = d whose logit equals the maximum, -1 for an empty document."""
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    tokens = tokens.to(dtype)
    n_tokens, n_vocab = tokens.shape[0], weight.shape[0]
    device = tokens.device
    out = torch.empty(n_docs, n_vocab, dtype=_out_dtype(dtype), device=device)
    arg = torch.empty(n_docs, n_vocab, dtype=torch.int64, device=device)
    step_tokens, step_vocab = _block_shape(n_tokens, device)
    none = n_tokens + 1  # above every row
    for v0 in range(0, n_vocab, step_vocab):
        columns = weight[v0 : v0 + step_vocab].to(dtype).T
        chunk = columns.shape[1]
        best = torch.full((n_docs, chunk), float("-inf"), dtype=dtype, device=device)
        best_row = torch.full((n_docs, chunk), -1, dtype=torch.int64, device=device)
        for t0 in range(0, n_tokens, step_tokens):
            logits = tokens[t0 : t0 + step_tokens] @ columns
            ids = doc_ids[t0 : t0 + step_tokens, None].expand_as(logits)
            top = torch.full_like(best, float("-inf")).scatter_reduce_(0, ids, logits, "amax")
            rows = torch.arange(t0, t0 + logits.shape[0], device=device)[:, None].expand_as(logits)
            rows = torch.where(logits == top.gather(0, ids), rows, none)
            top_row = torch.full_like(best_row, none).scatter_reduce_(0, ids, rows, "amin")
            take = top > best  # strictly: an earlier block's row stays on a tie
            best = torch.where(take, top, best)
            best_row = torch.where(take, top_row, best_row)
        if bias is not None:
            best += bias[v0 : v0 + chunk].to(dtype)
        out[:, v0 : v0 + chunk] = activate(best, activation)
        arg[:, v0 : v0 + chunk] = best_row
    return out, arg


def _argmax_backward(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor,
                     activation: str, needs: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    """(d tokens, dW, db) from the argmax: S[t, v] = g[d, v] at t = arg[d, v], built one [tokens, vocabulary]
    block at a time."""
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    g = grad.to(dtype) * _slope(out.to(dtype), activation)
    n_tokens, n_vocab = tokens.shape[0], weight.shape[0]
    device = tokens.device
    rows_f = tokens.to(dtype)
    d_tokens = torch.zeros(n_tokens, tokens.shape[1], dtype=dtype, device=device) if needs[0] else None
    d_weight = torch.zeros(n_vocab, weight.shape[1], dtype=dtype, device=device) if needs[1] else None
    step_tokens, step_vocab = _block_shape(n_tokens, device)
    for v0 in range(0, n_vocab, step_vocab):
        docs, cols = torch.nonzero((arg[:, v0 : v0 + step_vocab] >= 0) & (g[:, v0 : v0 + step_vocab] != 0),
                                   as_tuple=True)
        if docs.numel() == 0:
            continue
        rows = arg[docs, v0 + cols]
        values = g[docs, v0 + cols]
        chunk = min(step_vocab, n_vocab - v0)
        columns = weight[v0 : v0 + chunk].to(dtype)
        for t0 in range(0, n_tokens, step_tokens):
            t1 = min(t0 + step_tokens, n_tokens)
            inside = (rows >= t0) & (rows < t1)
            block = torch.zeros(t1 - t0, chunk, dtype=dtype, device=device)
            block[rows[inside] - t0, cols[inside]] = values[inside]  # one entry per (document, term): no clash
            if d_tokens is not None:
                d_tokens[t0:t1] += block @ columns
            if d_weight is not None:
                d_weight[v0 : v0 + chunk] += block.T @ rows_f[t0:t1]
    d_bias = g.sum(0) if needs[2] else None
    return d_tokens, d_weight, d_bias


class _SegmentMax(torch.autograd.Function):
    """Max pooling with the argmax saved ([B, V] int64) for an explicit backward (autograd over scatter_reduce's
    amax would split a tie's gradient evenly instead of following the tie rule)."""

    @staticmethod
    def forward(ctx, tokens: Tensor, weight: Tensor, bias: Tensor | None, doc_ids: Tensor, n_docs: int,
                activation: str) -> Tensor:
        out, arg = _segment_max_argmax(tokens, doc_ids, n_docs, weight, bias, activation)
        ctx.save_for_backward(tokens, weight, out, arg)
        ctx.activation = activation
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(arg)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        tokens, weight, out, arg = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2] and ctx.has_bias)
        d_tokens, d_weight, d_bias = _argmax_backward(grad, out, arg, tokens, weight, ctx.activation, needs)
        return (d_tokens.to(tokens.dtype) if d_tokens is not None else None,
                d_weight.to(weight.dtype) if d_weight is not None else None,
                d_bias.to(weight.dtype) if d_bias is not None else None, None, None, None)


def _segment_sum_grad(tokens: Tensor, doc_ids: Tensor, n_docs: int, weight: Tensor, bias: Tensor | None,
                      activation: str) -> Tensor:
    """Sum pooling under autograd: each vocabulary chunk's logits are recomputed in the backward, not kept."""
    dtype = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    _, step_vocab = _block_shape(tokens.shape[0], tokens.device)

    def chunk(rows: Tensor, columns: Tensor, shift: Tensor | None) -> Tensor:
        logits = rows.to(dtype) @ columns.to(dtype).T
        if shift is not None:
            logits = logits + shift.to(dtype)
        pooled = torch.zeros(n_docs, columns.shape[0], dtype=dtype, device=rows.device)
        return pooled.index_add(0, doc_ids, activate(logits, activation))

    parts = [checkpoint(chunk, tokens, weight[v0 : v0 + step_vocab],
                        None if bias is None else bias[v0 : v0 + step_vocab], use_reentrant=False)
             for v0 in range(0, weight.shape[0], step_vocab)]
    return torch.cat(parts, dim=1).to(_out_dtype(dtype))


def splade_max_reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor, *,
                         pooling: str = "max", activation: str = "log1p_relu") -> Tensor:
    """Padded SPLADE pooling. hidden [B, L, H], weight [V, H], bias [V] or None, mask [B, L]
    (nonzero = keep); returns float32 [B, V] (float64 for float64 inputs), differentiable."""
    batch, seq, _ = hidden.shape
    keep = mask.reshape(batch, seq) != 0
    doc_ids = torch.arange(batch, device=hidden.device).repeat_interleave(seq).reshape(batch, seq)
    return _segment_pool(hidden[keep], doc_ids[keep], batch, weight, bias, pooling, activation)


def splade_max_packed_reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor, *,
                                pooling: str = "max", activation: str = "log1p_relu") -> Tensor:
    """Packed SPLADE pooling. hidden [T, H], cu_seqlens [B+1] document offsets; returns float32 [B, V] (float64 for
    float64 inputs), differentiable."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    doc_ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device), lengths)
    return _segment_pool(hidden[: doc_ids.numel()], doc_ids, lengths.numel(), weight, bias, pooling, activation)
