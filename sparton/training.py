"""Sparton for training: the fused SPLADE head's forward with the argmax it needs, and its fused backward.

Gradient of w[d, v] = act(max_{t in d} H[t]·W[v] + b[v]): the max sends each (document, term) gradient to one token,
its argmax row. With g[d, v] = grad_out[d, v] · act'(pre[d, v]) and the [tokens, vocab] matrix
S[t, v] = g[doc(t), v] if t == argmax[doc(t), v] else 0, the gradients are two GEMMs and a sum:
dH = S·W (tokens × vocab × hidden), dW = Sᵀ·H (vocab × tokens × hidden), db[v] = Σ_d g[d, v].
S is never stored: each backward kernel builds its [tokens, vocab] tile in registers from the [B, V] argmax, the
upstream gradient and the forward's output (act' is a function of the output: relu makes it 0 where w = 0, and
log1p's derivative 1/(1+x) is e^-w), and feeds it to the tensor cores; fp32 accumulators, no atomics, so the
gradients are deterministic. A tile's rows belong to a few documents, and a document's argmax rows are its own, so
the tile is built from contiguous [K] slices of those documents' rows of the [B, V] arrays, one comparison with the
tile's row numbers per document: no per-element gathers. Memory beyond inputs, outputs and the int32 argmax: the
token→document map (4 bytes a token), a segment table and, for dH over few tokens, at most SPLIT_SCRATCH of partial
sums.

Tie rule: the argmax is the lowest token row (the earliest kept token of the document) among those whose logit
equals the maximum; a document without a kept token has argmax -1 and gets no gradient. The PyTorch reference
(reference.py) follows the same rule.

Why the training forward is a kernel of its own: the inference kernel (splade_head.py) cuts the token stream into
chunks regardless of document boundaries and merges a cut document's pieces with an atomic max of the finished
values; an (value, argmax) pair cannot be merged that way without a 64-bit [B, V] scratch. Here the stream is cut
into segments of whole documents (those starting in each run of SEGMENT rows), and one program walks a segment's
rows window by window for one vocabulary tile, carrying the open document's running max and argmax in registers:
every (document, term) is finished by one program and written with plain stores. The inference path is untouched:
calls that need no gradient run splade_head's kernel and write no argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from .splade_head import (
    INTERPRETED,
    INTERPRETER_PROGRAMS,
    _activate,
    _column_slabs,
    _double_log,
    _on,
    _tma_ready,
)

_NO_ROW = tl.constexpr(2147483647)  # above every row: min() ignores it


# ---------------------------------------------------------------------------------------------------- forward


@triton.jit(do_not_specialize=["stride_out", "T", "V", "n_segs"])
def _splade_argmax_kernel(
    tokens_desc,  # [T, H] token rows of all documents back to back, block [BLOCK_L, BLOCK_K]
    weight_desc,  # [V, H], block [BLOCK_V, BLOCK_K]
    bias_ptr,  # [V] or None
    keep_ptr,  # [T] keep flags (padded input's mask) or None
    doc_ptr,  # [T] int32 document of each row, non-decreasing
    start_ptr,  # [B+1] int32 first row of each document, then T
    seg_ptr,  # [n_segs+1] int32 first document of each segment, then B
    out_ptr,  # [B, V] fp32, zero-filled
    arg_ptr,  # [B, V] int32, filled with -1
    stride_out,
    T,
    V,
    n_segs,
    H: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_S: tl.constexpr,  # segments that take turns on one W tile while it is hot in L2
    DOT_PRECISION: tl.constexpr,
    SLAB: tl.constexpr,
    DOUBLE_LOG: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    n_vt = tl.cdiv(V, BLOCK_V)
    per_group = GROUP_S * n_vt
    offs_l = tl.arange(0, BLOCK_L)
    for item in tl.range(tl.program_id(0), n_segs * n_vt, tl.num_programs(0)):
        first_seg = (item // per_group) * GROUP_S
        group_size = tl.minimum(n_segs - first_seg, GROUP_S)
        seg = first_seg + (item % per_group) % group_size
        v0 = ((item % per_group) // group_size) * BLOCK_V
        d_lo = tl.load(seg_ptr + seg)
        d_hi = tl.load(seg_ptr + seg + 1)  # the segment: documents [d_lo, d_hi), rows [r_lo, r_hi)
        r_lo = tl.load(start_ptr + d_lo)
        r_hi = tl.load(start_ptr + d_hi)
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        bias = tl.zeros((BLOCK_V,), dtype=tl.float32)
        if bias_ptr is not None:
            bias = tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        # the open document d covers rows [begin, end); the next one ends at following
        d = d_lo
        begin = r_lo
        end = tl.load(start_ptr + tl.minimum(d_lo + 1, d_hi))
        following = tl.load(start_ptr + tl.minimum(d_lo + 2, d_hi))
        # its max and argmax over the windows before this one
        best = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
        best_row = tl.full((BLOCK_V,), -1, dtype=tl.int32)
        for row0 in range(r_lo, r_hi, BLOCK_L):
            rows = row0 + offs_l
            marks = ()
            for s in tl.static_range(BLOCK_L // SLAB):
                marks = marks + (tl.load(doc_ptr + tl.minimum(row0 + (s + 1) * SLAB - 1, r_hi - 1)),)  # noqa: RUF005
            if keep_ptr is not None:
                live = tl.load(keep_ptr + rows, mask=rows < r_hi, other=0) != 0

            acc = tl.zeros((BLOCK_V, BLOCK_L), dtype=tl.float32)
            for k in range(0, H, BLOCK_K):
                w = weight_desc.load([v0, k])
                h = tokens_desc.load([row0, k])
                acc = tl.dot(w, h.T, acc, input_precision=DOT_PRECISION)

            # As splade_head's epilogue, slab by slab, with each column's row carried beside its value: a strictly
            # greater value replaces it, so among equal logits the earliest row stays.
            if keep_ptr is not None:
                acc = tl.where(live[None, :], acc, float("-inf"))
            slabs = _column_slabs(acc, BLOCK_V, BLOCK_L, SLAB)
            part = tl.full((BLOCK_V, SLAB), float("-inf"), dtype=tl.float32)
            part_row = tl.full((BLOCK_V, SLAB), -1, dtype=tl.int32)
            for s in tl.static_range(BLOCK_L // SLAB):
                cols = row0 + s * SLAB + tl.arange(0, SLAB)
                # documents d .. that end inside this slab (past the segment, all that are left)
                n_end = tl.where(row0 + (s + 1) * SLAB <= r_hi, marks[s], d_hi) - d
                if n_end == 0:
                    part, part_row = _track(part, part_row, slabs[s], cols)
                else:
                    for _ in range(n_end):  # finish and write each
                        inside = (cols >= begin) & (cols < end)
                        part, part_row = _track(part, part_row, tl.where(inside[None, :], slabs[s], float("-inf")),
                                                cols)
                        best, best_row = _fold(best, best_row, part, part_row)
                        _write_pair(out_ptr, arg_ptr, d.to(tl.int64) * stride_out + offs_v, best, best_row, bias,
                                    v_ok, DOUBLE_LOG, FAST_LOG)
                        part = tl.full((BLOCK_V, SLAB), float("-inf"), dtype=tl.float32)
                        part_row = tl.full((BLOCK_V, SLAB), -1, dtype=tl.int32)
                        best = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
                        best_row = tl.full((BLOCK_V,), -1, dtype=tl.int32)
                        d += 1
                        begin = end
                        end = following
                        following = tl.load(start_ptr + tl.minimum(d + 2, d_hi))
                    if d < d_hi:  # the document open past this slab
                        part, part_row = _track(part, part_row,
                                                tl.where((cols >= begin)[None, :], slabs[s], float("-inf")), cols)
            best, best_row = _fold(best, best_row, part, part_row)  # carried into the next window
        if d < d_hi:  # the segment's last document, open to its end
            _write_pair(out_ptr, arg_ptr, d.to(tl.int64) * stride_out + offs_v, best, best_row, bias, v_ok,
                        DOUBLE_LOG, FAST_LOG)


@triton.jit
def _track(part, part_row, x, cols):
    """Column-wise running max and its row; a later column replaces the kept one only when strictly greater."""
    take = x > part
    return tl.where(take, x, part), tl.where(take, cols[None, :], part_row)


@triton.jit
def _fold(best, best_row, part, part_row):
    """Reduce a window's columns to (max, lowest row holding it) and merge it into the earlier windows' pair."""
    m = tl.max(part, axis=1)
    r = tl.min(tl.where(part == m[:, None], part_row, _NO_ROW), axis=1)
    take = m > best
    return tl.where(take, m, best), tl.where(take, r, best_row)


@triton.jit
def _write_pair(out_ptr, arg_ptr, offs, best, best_row, bias, ok, DOUBLE_LOG: tl.constexpr, FAST_LOG: tl.constexpr):
    tl.store(out_ptr + offs, _activate(best + bias, DOUBLE_LOG, FAST_LOG), mask=ok)
    tl.store(arg_ptr + offs, best_row, mask=ok)


# ---------------------------------------------------------------------------------------------------- backward


@triton.jit
def _grad_pre(go, w, DOUBLE_LOG: tl.constexpr):
    """g = grad_out · act'(pre), from the activation's output w: 0 where relu cut (w = 0); log1p'(x) = 1/(1+x) = e^-w
    and, for log1p(log1p(relu)), 1/(1+u) · 1/(1+x) = e^-w · e^-u with u = e^w - 1."""
    slope = tl.exp(-(w + (tl.exp(w) - 1.0))) if DOUBLE_LOG else tl.exp(-w)
    return tl.where(w > 0, go * slope, 0.0)


@triton.jit
def _doc_slice(grad_ptr, out_ptr, arg_ptr, d, d_last, cols, col_ok, stride_gd, stride_gv, stride_w, scale,
               DOUBLE_LOG: tl.constexpr):
    """Document d's argmax rows and g over the vocabulary entries cols: contiguous [K] loads, one activation
    derivative per entry. Past the tile's last document (d > d_last) rows are -1, which no row equals."""
    ok = tl.where(d <= d_last, col_ok, False)  # (the interpreter mistypes a scalar & a tensor)
    d = tl.cast(d, tl.int64)  # a loop counter: a plain int under the interpreter
    arg = tl.load(arg_ptr + d * stride_w + cols, mask=ok, other=-1)
    go = tl.load(grad_ptr + d * stride_gd + cols * stride_gv, mask=ok, other=0.0)
    w = tl.load(out_ptr + d * stride_w + cols, mask=ok, other=0.0)
    return arg, _grad_pre(go, w, DOUBLE_LOG) * scale


@triton.jit(do_not_specialize=["stride_gd", "stride_gv", "stride_w", "T", "V", "SPLIT_V"])
def _grad_hidden_kernel(
    weight_desc,  # [V, H], block [BLOCK_K, BLOCK_H]
    grad_ptr,  # [B, V] upstream gradient, any strides
    out_ptr,  # [B, V] fp32 forward output
    arg_ptr,  # [B, V] int32 argmax row (-1: none); same strides as out
    doc_ptr,  # [T] int32 document of each row, non-decreasing
    scale_ptr,  # fp32 scalar: S is multiplied by it before the 16-bit cast (fp16 range), or None
    dh_ptr,  # [T, H] output, hidden's dtype
    part_ptr,  # [n_splits, T, H] fp32 partial sums (the vocabulary split in ranges), or None: dh_ptr directly
    stride_gd,
    stride_gv,
    stride_w,
    T,
    V,
    SPLIT_V,  # vocabulary entries per split, a multiple of BLOCK_K
    H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NDOC: tl.constexpr,  # documents whose [K] slices build S together
    DOUBLE_LOG: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dH[t, h] = Σ_v S[t, v]·W[v, h]: a [BLOCK_T, BLOCK_H] tile, K = the vocabulary (or one split of it).

    Each K step builds S from the [K] slices of the argmax and g of the tile's documents: S[t, v] = g[d, v] where t
    is document d's argmax, and the documents' rows are disjoint, so one comparison per document places every entry.
    The tile's documents go NDOC at a time, one sweep of K each: a single sweep unless the tile holds more than NDOC
    (short) documents. The sweep is the innermost loop, software-pipelined like a plain GEMM's."""
    n_h = H // BLOCK_H
    n_tiles = tl.cdiv(T, BLOCK_T) * n_h
    tile = tl.program_id(0) % n_tiles
    split = tl.program_id(0) // n_tiles
    t0 = (tile // n_h) * BLOCK_T
    h0 = (tile % n_h) * BLOCK_H
    v_lo = split * SPLIT_V
    v_hi = tl.minimum(v_lo + SPLIT_V, V)
    rows = t0 + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    d_last = tl.load(doc_ptr + tl.minimum(t0 + BLOCK_T, T) - 1)
    scale = 1.0
    if scale_ptr is not None:
        scale = tl.load(scale_ptr)
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for d0 in range(tl.load(doc_ptr + t0), d_last + 1, NDOC):
        for k in range(v_lo, v_hi, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            col_ok = cols < v_hi
            s = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
            for j in tl.static_range(NDOC):
                arg, g = _doc_slice(grad_ptr, out_ptr, arg_ptr, d0 + j, d_last, cols, col_ok, stride_gd, stride_gv,
                                    stride_w, scale, DOUBLE_LOG)
                s = tl.where(arg[None, :] == rows[:, None], g[None, :], s)
            wt = weight_desc.load([k, h0])
            acc = tl.dot(s.to(wt.dtype), wt, acc, input_precision=DOT_PRECISION)
    acc = acc / scale
    offs = rows[:, None].to(tl.int64) * H + (h0 + tl.arange(0, BLOCK_H))[None, :]
    if part_ptr is None:
        tl.store(dh_ptr + offs, acc.to(dh_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(part_ptr + split.to(tl.int64) * T * H + offs, acc, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["stride_gd", "stride_gv", "stride_w", "T", "V"])
def _grad_weight_kernel(
    tokens_desc,  # [T, H], block [BLOCK_T, BLOCK_H]
    grad_ptr,
    out_ptr,
    arg_ptr,
    doc_ptr,
    scale_ptr,
    pass_ptr,  # int32 scalar: sweeps over the tokens (the most documents a window spans, NDOC a sweep), or None: 1
    dw_ptr,  # [V, H] output, weight's dtype
    stride_gd,
    stride_gv,
    stride_w,
    T,
    V,
    H: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NDOC: tl.constexpr,
    DOUBLE_LOG: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dW[v, h] = Σ_t S[t, v]·H[t, h]: a [BLOCK_V, BLOCK_H] tile, K = the tokens, BLOCK_T rows a step. Each window's
    Sᵀ comes from the [BLOCK_V] slices of NDOC of the documents it spans; sweep p takes each window's documents
    p·NDOC .. p·NDOC + NDOC - 1. The number of sweeps is one for all the windows (a branch per window would stop
    the loop's pipelining): where one window spans more documents, the others add zeros in the extra sweeps."""
    n_h = H // BLOCK_H
    v0 = (tl.program_id(0) // n_h) * BLOCK_V
    h0 = (tl.program_id(0) % n_h) * BLOCK_H
    offs_v = v0 + tl.arange(0, BLOCK_V)
    v_ok = offs_v < V
    scale = 1.0
    if scale_ptr is not None:
        scale = tl.load(scale_ptr)
    n_pass = 1
    if pass_ptr is not None:
        n_pass = tl.load(pass_ptr)
    acc = tl.zeros((BLOCK_V, BLOCK_H), dtype=tl.float32)
    for p in range(0, n_pass):
        for t0 in range(0, T, BLOCK_T):
            rows = t0 + tl.arange(0, BLOCK_T)
            d0 = tl.load(doc_ptr + t0) + p * NDOC
            d_last = tl.load(doc_ptr + tl.minimum(t0 + BLOCK_T, T) - 1)
            s = tl.zeros((BLOCK_V, BLOCK_T), dtype=tl.float32)  # Sᵀ
            for j in tl.static_range(NDOC):
                arg, g = _doc_slice(grad_ptr, out_ptr, arg_ptr, d0 + j, d_last, offs_v, v_ok, stride_gd, stride_gv,
                                    stride_w, scale, DOUBLE_LOG)
                s = tl.where(arg[:, None] == rows[None, :], g[:, None], s)
            h = tokens_desc.load([t0, h0])
            acc = tl.dot(s.to(h.dtype), h, acc, input_precision=DOT_PRECISION)
    acc = acc / scale
    offs_h = h0 + tl.arange(0, BLOCK_H)
    tl.store(dw_ptr + offs_v[:, None].to(tl.int64) * H + offs_h[None, :], acc.to(dw_ptr.dtype.element_ty),
             mask=v_ok[:, None])


@triton.jit(do_not_specialize=["stride_gd", "stride_gv", "stride_w", "B", "V"])
def _grad_bias_kernel(grad_ptr, out_ptr, db_ptr, stride_gd, stride_gv, stride_w, B, V,
                      BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOUBLE_LOG: tl.constexpr):
    """db[v] = Σ_d g[d, v], in a fixed order."""
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = offs_v < V
    acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for d0 in range(0, B, BLOCK_D):
        docs = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
        ok = (docs < B)[:, None] & v_ok[None, :]
        go = tl.load(grad_ptr + docs[:, None] * stride_gd + offs_v[None, :] * stride_gv, mask=ok, other=0.0)
        w = tl.load(out_ptr + docs[:, None] * stride_w + offs_v[None, :], mask=ok, other=0.0)
        acc += tl.sum(_grad_pre(go, w, DOUBLE_LOG), axis=0)
    tl.store(db_ptr + offs_v, acc.to(db_ptr.dtype.element_ty), mask=v_ok)


# ---------------------------------------------------------------------------------------------------- launchers

# 16-bit forward: the inference kernel's tile (256 × 128 × 64, 8 warps, 3 stages, 16-column slabs); segments of
# 1,024 rows (8 windows), 8 of them in L2 while W streams past (the inference kernel's 64 chunks of 128 rows).
FORWARD_16 = {"BLOCK_V": 256, "BLOCK_L": 128, "BLOCK_K": 64, "GROUP_S": 8, "SLAB": 16, "SEGMENT": 1024,
              "num_warps": 8, "num_stages": 3}
FORWARD_32 = {"BLOCK_V": 128, "BLOCK_L": 64, "BLOCK_K": 32, "GROUP_S": 8, "SLAB": 16, "SEGMENT": 1024,
              "num_warps": 8, "num_stages": 3}
# Backward tiles: 128 × 256 fp32 accumulators (128 registers a thread at 8 warps, as the forward's), K = 32. S is
# built in registers from the [K] slices of NDOC documents a step (two for packed input: a 128-row tile or a 32-row
# window of documents ≥ 127 or ≥ 31 tokens spans at most two); padded input gets the exact count where it is at most
# MAX_NDOC. sm_90 (ptxas, Triton 3.9): dH 224 / 228 / 210 registers at NDOC 1 / 2 / 4, dW 227 / 210 / 254, no
# spills, every load software-pipelined. dH with fewer 128-row tiles than SMs ("small": 64-row tiles, 169
# registers) doubles its tiles before splitting the vocabulary.
GRAD_HIDDEN_16 = {"BLOCK_T": 128, "BLOCK_H": 256, "BLOCK_K": 32, "NDOC": 2, "num_warps": 8, "num_stages": 4,
                  "small": {"BLOCK_T": 64, "BLOCK_H": 256, "BLOCK_K": 32, "NDOC": 2, "num_warps": 8,
                            "num_stages": 4}}
GRAD_WEIGHT_16 = {"BLOCK_V": 128, "BLOCK_H": 256, "BLOCK_T": 32, "NDOC": 2, "num_warps": 8, "num_stages": 4}
GRAD_HIDDEN_32 = {"BLOCK_T": 64, "BLOCK_H": 128, "BLOCK_K": 16, "NDOC": 2, "num_warps": 4, "num_stages": 3}
GRAD_WEIGHT_32 = {"BLOCK_V": 64, "BLOCK_H": 128, "BLOCK_T": 16, "NDOC": 2, "num_warps": 4, "num_stages": 3}
GRAD_BIAS = {"BLOCK_D": 16, "BLOCK_V": 128}
# dH has few tiles when T is small (queries; the large batches a 250,002-term head trains at are not): the vocabulary
# is then split in ranges whose fp32 partial sums go to a scratch of at most this size and are added in a fixed
# order, until the programs fill the GPU twice over (each range ≥ 32 K steps).
SPLIT_SCRATCH = 8 * 2**20
MAX_NDOC = 4  # padded input: the documents a tile spans, where fixed, taken in one step up to this many
# Under TRITON_INTERPRET=1: small tiles, so that small shapes cover several windows per segment, documents over
# windows and segments, several documents per slab, odd segment edges and several K steps.
INTERPRETER_FORWARD = {"BLOCK_V": 32, "BLOCK_L": 16, "BLOCK_K": 16, "GROUP_S": 2, "SLAB": 4, "SEGMENT": 40}
INTERPRETER_GRAD_HIDDEN = {"BLOCK_T": 16, "BLOCK_H": 16, "BLOCK_K": 16, "NDOC": 2}
INTERPRETER_GRAD_WEIGHT = {"BLOCK_V": 16, "BLOCK_H": 16, "BLOCK_T": 16, "NDOC": 2}
INTERPRETER_GRAD_BIAS = {"BLOCK_D": 4, "BLOCK_V": 16}


def _check_inputs(tokens: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    n_vocab, hidden = weight.shape
    if tokens.dtype != weight.dtype or tokens.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"sparton: hidden, weight need one float dtype: {tokens.dtype}, {weight.dtype}")
    if tokens.shape[-1] != hidden or (bias is not None and bias.shape != (n_vocab,)):
        raise ValueError(f"sparton: shapes differ: hidden {tuple(tokens.shape)} weight {tuple(weight.shape)}")
    if hidden % 16:
        raise ValueError(f"sparton: hidden size {hidden} must be a multiple of 16")
    if tokens.device.type == "cpu" and tokens.dtype == torch.bfloat16:
        raise NotImplementedError("sparton: Triton's interpreter multiplies bf16 as raw integers; use fp16")


def _programs(device: torch.device) -> int:
    if device.type == "cpu":
        return INTERPRETER_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _fast_log(t: Tensor) -> bool:
    return t.is_cuda and not INTERPRETED and torch.version.hip is None


def _precision(dtype: torch.dtype) -> str:
    return "tf32x3" if dtype == torch.float32 else "tf32"  # ignored for 16-bit operands


def _forward(tokens: Tensor, weight: Tensor, bias: Tensor | None, keep: Tensor | None, doc: Tensor, start: Tensor,
             n_docs: int, activation: str, out: Tensor | None = None, arg: Tensor | None = None,
             config: dict | None = None) -> tuple[Tensor, Tensor]:
    _check_inputs(tokens, weight, bias)
    n_rows = tokens.shape[0]
    n_vocab, hidden = weight.shape
    device = tokens.device
    out = torch.zeros(n_docs, n_vocab, dtype=torch.float32, device=device) if out is None else out.zero_()
    arg = torch.full((n_docs, n_vocab), -1, dtype=torch.int32, device=device) if arg is None else arg.fill_(-1)
    if n_rows == 0 or n_vocab == 0 or n_docs == 0:
        return out, arg
    if config is None:
        config = INTERPRETER_FORWARD if device.type == "cpu" else (
            FORWARD_32 if tokens.dtype == torch.float32 else FORWARD_16)
    config = dict(config)
    segment = config.pop("SEGMENT")
    if hidden % config["BLOCK_K"]:
        raise ValueError(f"sparton: hidden size {hidden} is not a multiple of the tile's {config['BLOCK_K']}")
    # segment k: the documents starting in rows [k·segment, (k+1)·segment), whole (no device sync)
    n_segs = triton.cdiv(n_rows, segment)
    bounds = torch.arange(0, n_segs * segment, segment, dtype=torch.int32, device=device)
    seg = torch.empty(n_segs + 1, dtype=torch.int32, device=device)
    torch.searchsorted(start[:-1], bounds, out_int32=True, out=seg[:-1])
    seg[-1] = n_docs
    tokens_desc = TensorDescriptor.from_tensor(_tma_ready(tokens), [config["BLOCK_L"], config["BLOCK_K"]])
    weight_desc = TensorDescriptor.from_tensor(_tma_ready(weight), [config["BLOCK_V"], config["BLOCK_K"]])
    items = n_segs * triton.cdiv(n_vocab, config["BLOCK_V"])
    with _on(device):
        _splade_argmax_kernel[(min(_programs(device), items),)](
            tokens_desc, weight_desc, bias, keep, doc, start, seg, out, arg, out.stride(0), n_rows, n_vocab, n_segs,
            hidden, DOT_PRECISION=_precision(tokens.dtype), DOUBLE_LOG=_double_log(activation),
            FAST_LOG=_fast_log(tokens), **config)
    return out, arg


def _pick(configs: dict, hidden: int, padded_len: int | None, rows_key: str, n_rows: int | None = None,
          programs: int = 0) -> tuple[dict, bool]:
    """(config, exact) for a backward kernel: the "small" variant where the main one has fewer tiles than programs
    (n_rows given); BLOCK_H lowered to a power of two dividing H; NDOC the documents a tile (rows_key rows) spans
    where padded input fixes it (exact: every tile spans at most NDOC), else the config's."""
    if "small" in configs and n_rows is not None and \
            triton.cdiv(n_rows, configs[rows_key]) * (hidden // _block_h(configs["BLOCK_H"], hidden)) < programs:
        configs = configs["small"]
    config = {k: v for k, v in configs.items() if k != "small"}
    config["BLOCK_H"] = _block_h(config["BLOCK_H"], hidden)
    exact = False
    if padded_len:  # the most documents a tile of `rows` rows, starting at a multiple of them, can span
        rows = config[rows_key]
        span = 1 if padded_len % rows == 0 else rows // padded_len if rows % padded_len == 0 else \
            (rows - 1) // padded_len + 2
        if span <= MAX_NDOC:
            config["NDOC"], exact = span, True
    return config, exact


def _block_h(block: int, hidden: int) -> int:
    while hidden % block:
        block //= 2
    return block


def _sweeps(doc: Tensor, n_rows: int, block: int, ndoc: int) -> Tensor:
    """int32 [1] on the device: dW's sweeps over the tokens, the most documents a BLOCK_T-row window spans over
    NDOC (no host sync)."""
    first = doc[::block]
    last = doc[torch.arange(block - 1, n_rows + block - 1, block, device=doc.device).clamp_max_(n_rows - 1)]
    return ((last - first).max().reshape(1) + ndoc).div_(ndoc, rounding_mode="floor")


def _backward(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, doc: Tensor,
              padded_len: int | None, activation: str, need_hidden: bool = True, need_weight: bool = True,
              need_bias: bool = True, grads: tuple[Tensor | None, Tensor | None, Tensor | None] | None = None,
              configs: tuple[dict, dict, dict] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(d tokens [T, H], dW [V, H], db float32 [V]); a gradient not asked for comes back empty. padded_len: the
    documents' common row count (padded input), which fixes how many documents a tile spans.
    grads: buffers to write into (tests poison them); configs: (hidden, weight, bias) tile configs."""
    n_rows, hidden = tokens.shape
    n_docs, n_vocab = out.shape
    device = tokens.device
    cpu = device.type == "cpu"
    if configs is None:
        if cpu:
            configs = (INTERPRETER_GRAD_HIDDEN, INTERPRETER_GRAD_WEIGHT, INTERPRETER_GRAD_BIAS)
        elif tokens.dtype == torch.float32:
            configs = (GRAD_HIDDEN_32, GRAD_WEIGHT_32, GRAD_BIAS)
        else:
            configs = (GRAD_HIDDEN_16, GRAD_WEIGHT_16, GRAD_BIAS)
    cfg_h, _ = _pick(configs[0], hidden, padded_len, "BLOCK_T", n_rows, _programs(device))
    cfg_w, exact_w = _pick(configs[1], hidden, padded_len, "BLOCK_T")
    cfg_b = configs[2]
    dh_buf, dw_buf, db_buf = grads if grads is not None else (None, None, None)
    # row-major, whatever the inputs' strides (the kernels write rows of H); a gradient not asked for: an empty
    # tensor of its own (a custom op's outputs may not alias each other)
    dh = (dh_buf if dh_buf is not None else tokens.new_empty(tokens.shape)) if need_hidden else tokens.new_empty(0)
    dw = (dw_buf if dw_buf is not None else weight.new_empty(weight.shape)) if need_weight else weight.new_empty(0)
    db = (db_buf if db_buf is not None else weight.new_empty(n_vocab, dtype=torch.float32)) if need_bias \
        else weight.new_empty(0)
    if n_rows == 0 or n_vocab == 0 or n_docs == 0:
        for t in (dh, dw, db):
            t.zero_()
        return dh, dw, db
    out, arg = out.contiguous(), arg.contiguous()
    strides = (grad.stride(0), grad.stride(1), out.stride(0))
    double_log = _double_log(activation)
    scale = None
    if tokens.dtype == torch.float16:
        # S goes to the tensor cores in fp16: scaled by a power of two so that its largest value is near 2**14
        # (|g| ≤ |grad_out|: act' ≤ 1), not lost below fp16's smallest normal; the fp32 sums are scaled back.
        low, high = torch.aminmax(grad)
        largest = torch.maximum(high, -low).float().clamp_min(2.0**-100)
        scale = torch.exp2(14.0 - torch.ceil(torch.log2(largest)))
    precision = _precision(tokens.dtype)
    tokens = _tma_ready(tokens)
    with _on(device):
        if need_hidden:
            cfg_h = dict(cfg_h)
            block_k = cfg_h["BLOCK_K"]
            tiles = triton.cdiv(n_rows, cfg_h["BLOCK_T"]) * (hidden // cfg_h["BLOCK_H"])
            splits = cfg_h.pop("SPLIT", None) or _splits(tiles, _programs(device), n_rows * hidden * 4,
                                                         triton.cdiv(n_vocab, block_k))
            split_v = triton.cdiv(triton.cdiv(n_vocab, splits), block_k) * block_k
            splits = triton.cdiv(n_vocab, split_v)
            parts = torch.empty(splits, n_rows, hidden, dtype=torch.float32, device=device) if splits > 1 else None
            weight_desc = TensorDescriptor.from_tensor(_tma_ready(weight), [block_k, cfg_h["BLOCK_H"]])
            _grad_hidden_kernel[(tiles * splits,)](
                weight_desc, grad, out, arg, doc, scale, dh, parts, *strides, n_rows, n_vocab, split_v, hidden,
                DOUBLE_LOG=double_log, DOT_PRECISION=precision, **cfg_h)
            if parts is not None:
                for part in parts[1:]:  # in a fixed order, in place: no scratch beyond the partials
                    parts[0] += part
                dh.copy_(parts[0])
        if need_weight:
            tokens_desc = TensorDescriptor.from_tensor(tokens, [cfg_w["BLOCK_T"], cfg_w["BLOCK_H"]])
            sweeps = None if exact_w else _sweeps(doc, n_rows, cfg_w["BLOCK_T"], cfg_w["NDOC"])
            grid = (triton.cdiv(n_vocab, cfg_w["BLOCK_V"]) * (hidden // cfg_w["BLOCK_H"]),)
            _grad_weight_kernel[grid](tokens_desc, grad, out, arg, doc, scale, sweeps, dw, *strides, n_rows, n_vocab,
                                      hidden, DOUBLE_LOG=double_log, DOT_PRECISION=precision, **cfg_w)
        if need_bias:
            grid = (triton.cdiv(n_vocab, cfg_b["BLOCK_V"]),)
            _grad_bias_kernel[grid](grad, out, db, *strides, n_docs, n_vocab, DOUBLE_LOG=double_log, **cfg_b)
    return dh, dw, db


def _splits(tiles: int, programs: int, part_bytes: int, k_steps: int) -> int:
    """How many vocabulary ranges dH's K loop is split in (see SPLIT_SCRATCH)."""
    wanted = triton.cdiv(2 * programs, tiles)
    return max(1, min(wanted, SPLIT_SCRATCH // part_bytes, k_steps // 32))


def _padded_rows(hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    batch, seq, hidden_size = hidden.shape
    if mask.shape != (batch, seq):
        raise ValueError(f"sparton: mask {tuple(mask.shape)} does not match hidden {tuple(hidden.shape)}")
    doc = torch.arange(batch, device=hidden.device, dtype=torch.int32).repeat_interleave(seq)
    start = torch.arange(0, (batch + 1) * seq, seq, device=hidden.device, dtype=torch.int32)
    return hidden.reshape(batch * seq, hidden_size), mask.reshape(batch * seq), doc, start


def _packed_rows(hidden: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor]:
    if hidden.dim() != 2 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("sparton: packed input wants hidden [T, H] and cu_seqlens [B+1]")
    cu = cu_seqlens.to(device=hidden.device, dtype=torch.int32)
    n_docs, n_rows = cu.numel() - 1, hidden.shape[0]
    ids = torch.arange(n_docs, device=hidden.device, dtype=torch.int32)
    return ids.repeat_interleave(cu[1:] - cu[:-1], output_size=n_rows), cu  # output_size: no device sync


def splade_max_argmax_triton(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor,
                             activation: str = "log1p_relu", out: Tensor | None = None, arg: Tensor | None = None,
                             config: dict | None = None) -> tuple[Tensor, Tensor]:
    """Padded input (as splade_head.splade_max_triton) → (w float32 [B, V], argmax int32 [B, V]); argmax is a row of
    hidden viewed as [B·L, H]: b·L + s."""
    tokens, keep, doc, start = _padded_rows(hidden, mask)
    return _forward(tokens, weight, bias, keep, doc, start, hidden.shape[0], activation, out, arg, config)


def splade_max_packed_argmax_triton(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor,
                                    activation: str = "log1p_relu", out: Tensor | None = None,
                                    arg: Tensor | None = None, config: dict | None = None) -> tuple[Tensor, Tensor]:
    """Packed input → (w float32 [B, V], argmax int32 [B, V]); argmax is a row of hidden."""
    doc, cu = _packed_rows(hidden, cu_seqlens)
    return _forward(hidden, weight, bias, None, doc, cu, cu.numel() - 1, activation, out, arg, config)


# ---------------------------------------------------------------------------------------------------- custom ops


@torch.library.custom_op("sparton::splade_max_argmax", mutates_args=())
def splade_max_argmax_op(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor,
                         activation: str = "log1p_relu") -> tuple[Tensor, Tensor]:
    return splade_max_argmax_triton(hidden, weight, bias, mask, activation)


@splade_max_argmax_op.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor,
      activation: str = "log1p_relu") -> tuple[Tensor, Tensor]:
    shape = (hidden.shape[0], weight.shape[0])
    return hidden.new_empty(shape, dtype=torch.float32), hidden.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("sparton::splade_max_packed_argmax", mutates_args=())
def splade_max_packed_argmax_op(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor,
                                max_seqlen: int | None = None,
                                activation: str = "log1p_relu") -> tuple[Tensor, Tensor]:
    return splade_max_packed_argmax_triton(hidden, weight, bias, cu_seqlens, activation)


@splade_max_packed_argmax_op.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor, max_seqlen: int | None = None,
      activation: str = "log1p_relu") -> tuple[Tensor, Tensor]:
    shape = (cu_seqlens.shape[0] - 1, weight.shape[0])
    return hidden.new_empty(shape, dtype=torch.float32), hidden.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("sparton::splade_max_backward", mutates_args=())
def splade_max_backward_op(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, doc: Tensor,
                           padded_len: int | None, activation: str, need_hidden: bool, need_weight: bool,
                           need_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _backward(grad, out, arg, tokens, weight, doc, padded_len, activation, need_hidden, need_weight, need_bias)


@splade_max_backward_op.register_fake
def _(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, doc: Tensor, padded_len: int | None,
      activation: str, need_hidden: bool, need_weight: bool, need_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    return (tokens.new_empty(tokens.shape) if need_hidden else tokens.new_empty(0),
            weight.new_empty(weight.shape) if need_weight else weight.new_empty(0),
            weight.new_empty(weight.shape[0], dtype=torch.float32) if need_bias else weight.new_empty(0))


def _bias_grad(db: Tensor, bias: Tensor | None) -> Tensor | None:
    return db.to(bias.dtype) if bias is not None and db.numel() else None


def _setup_padded(ctx, inputs: tuple, output: tuple) -> None:
    hidden, weight, bias, _mask, activation = inputs
    out, arg = output
    ctx.save_for_backward(hidden, weight, bias, out, arg)
    ctx.activation = activation


def _backward_padded(ctx, grad: Tensor, _grad_arg: Tensor | None) -> tuple:
    hidden, weight, bias, out, arg = ctx.saved_tensors
    batch, seq, size = hidden.shape
    doc = torch.arange(batch, device=hidden.device, dtype=torch.int32).repeat_interleave(seq)
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    dh, dw, db = torch.ops.sparton.splade_max_backward(grad, out, arg, hidden.reshape(batch * seq, size), weight, doc,
                                                      seq, ctx.activation, need_h, need_w, need_b and bias is not None)
    return (dh.view(batch, seq, size) if need_h else None, dw if need_w else None, _bias_grad(db, bias), None, None)


def _setup_packed(ctx, inputs: tuple, output: tuple) -> None:
    hidden, weight, bias, cu_seqlens, _max_seqlen, activation = inputs
    out, arg = output
    ctx.save_for_backward(hidden, weight, bias, cu_seqlens, out, arg)
    ctx.activation = activation


def _backward_packed(ctx, grad: Tensor, _grad_arg: Tensor | None) -> tuple:
    hidden, weight, bias, cu_seqlens, out, arg = ctx.saved_tensors
    doc, _ = _packed_rows(hidden, cu_seqlens)
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    dh, dw, db = torch.ops.sparton.splade_max_backward(grad, out, arg, hidden, weight, doc, None, ctx.activation,
                                                      need_h, need_w, need_b and bias is not None)
    return dh if need_h else None, dw if need_w else None, _bias_grad(db, bias), None, None, None


splade_max_argmax_op.register_autograd(_backward_padded, setup_context=_setup_padded)
splade_max_packed_argmax_op.register_autograd(_backward_packed, setup_context=_setup_packed)
