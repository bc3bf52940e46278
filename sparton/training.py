"""Sparton for training: the fused SPLADE head's forward with the argmax it needs, and its fused backward.

Gradient of w[d, v] = act(max_{t in d} H[t]·W[v] + b[v]): the max sends each (document, term) gradient to one token,
its argmax row. With g[d, v] = grad_out[d, v] · act'(pre[d, v]) (act' is a function of the output: relu makes it 0
where w = 0, and log1p's derivative 1/(1+x) is e^-w), the gradients are sums over the B·V (document, term) pairs, one
token row each:
    dW[v] = Σ_d g[d, v]·H[arg[d, v]],    dH[t] = Σ_{(d, v): arg[d, v] = t} g[d, v]·W[v],    db[v] = Σ_d g[d, v].
dW and db gather each term's B rows of H in document order: 2·B·V·H reads instead of a [V, T] by [T, H] product's
2·T·V·H multiply-adds (L times fewer for documents of L tokens), and pairs without a gradient (relu cut) read
nothing. dH is the product G·W of a one-hot G [T, V] (G[t, v] = g[d, v] where arg[d, v] = t, t a row of document d)
on the tensor cores: each program takes a chunk of one document's rows, builds G's tiles in registers from the
document's g and argmax as it walks the vocabulary, and never stores them. A gather for dH would need each row's
pairs: a sort, scratch memory, and a short document's few rows each summing thousands of pairs one after another.
Sums are fp32 in a fixed order, no atomics: the gradients are deterministic. Memory beyond inputs, outputs and the
int32 argmax: two int32 [B + 1] tables.

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


@triton.jit(do_not_specialize=["stride_gd", "stride_gv", "stride_w", "B", "V"])
def _grad_weight_kernel(
    tokens_ptr,  # [T, H], any strides
    grad_ptr,  # [B, V] upstream gradient, any strides
    out_ptr,  # [B, V] fp32 forward output, row-major
    arg_ptr,  # [B, V] int32 argmax row (-1: none), row-major
    dw_ptr,  # [V, H] output, weight's dtype, or None
    db_ptr,  # [V] fp32 output, or None
    stride_tt,
    stride_th,
    stride_gd,
    stride_gv,
    stride_w,
    B,
    V,
    H: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOUBLE_LOG: tl.constexpr,
):
    """dW[v, h] = Σ_d g[d, v]·H[arg[d, v], h] for a [BLOCK_V, BLOCK_H] tile, and db[v] = Σ_d g[d, v] (programs of the
    first H block). Each document adds one gathered row per term, in document order: a fixed summation order. Rows
    of pairs without a gradient (relu cut, no kept token) are not read."""
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = offs_v < V
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols_v, cols_h = offs_v.to(tl.int64), offs_h.to(tl.int64)  # strided views: offsets past 2^31 elements
    acc = tl.zeros((BLOCK_V, BLOCK_H), dtype=tl.float32)
    total = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for d in range(0, B):
        d = tl.cast(d, tl.int64)  # a loop counter: a plain int under the interpreter
        go = tl.load(grad_ptr + d * stride_gd + cols_v * stride_gv, mask=v_ok, other=0.0)
        w = tl.load(out_ptr + d * stride_w + offs_v, mask=v_ok, other=0.0)
        g = _grad_pre(go, w, DOUBLE_LOG)
        total += g
        if dw_ptr is not None:
            arg = tl.load(arg_ptr + d * stride_w + offs_v, mask=v_ok, other=-1)
            hit = (g != 0.0) & (arg >= 0)
            rows = tl.load(tokens_ptr + arg.to(tl.int64)[:, None] * stride_tt + cols_h[None, :] * stride_th,
                           mask=hit[:, None], other=0.0)
            acc += g[:, None] * rows.to(tl.float32)
    if dw_ptr is not None:
        tl.store(dw_ptr + offs_v[:, None].to(tl.int64) * H + offs_h[None, :], acc.to(dw_ptr.dtype.element_ty),
                 mask=v_ok[:, None])
    if db_ptr is not None:
        first_block = tl.where(tl.program_id(1) == 0, v_ok, False)  # (the interpreter mistypes a scalar & a tensor)
        tl.store(db_ptr + offs_v, total, mask=first_block)


@triton.jit
def _lower_bound(keys_ptr, n, target):
    """The first index of the sorted keys[0:n] whose key is at least target (n if none)."""
    lo = tl.zeros((), dtype=tl.int64)
    hi = lo + n
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(keys_ptr + mid) < target
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo


@triton.jit(do_not_specialize=["stride_gd", "stride_gv", "stride_w", "B", "V"])
def _grad_hidden_kernel(
    weight_ptr,  # [V, H], any strides
    grad_ptr,  # [B, V] upstream gradient, any strides
    out_ptr,  # [B, V] fp32 forward output, row-major
    arg_ptr,  # [B, V] int32 argmax row (-1: none), row-major
    bounds_ptr,  # [B + 1] int32 first row of each document, with bounds[0] = 0 and bounds[B] = T
    chunks_ptr,  # [B + 1] int32 first chunk of each document (a chunk: BLOCK_T rows of one document)
    dh_ptr,  # [T, H] output, hidden's dtype, row-major
    stride_wv,
    stride_wh,
    stride_gd,
    stride_gv,
    stride_w,
    B,
    V,
    H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOUBLE_LOG: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dH[t, h] = Σ_v G[t, v]·W[v, h] for BLOCK_T rows of one document d and BLOCK_H columns, where G[t, v] =
    g[d, v] if arg[d, v] = t, else 0: the scatter of the document's pairs onto its rows is a one-hot product on the
    tensor cores, G built tile by tile in registers from the document's g and argmax (one compare an element) and
    never stored. G is rounded to W's dtype (as an eager bf16 head's gradient of the logits is), fp32 accumulation
    over the vocabulary in a fixed order. Every row of the chunk is written, zeros where no pair chose it."""
    chunk = tl.program_id(0)
    if chunk >= tl.load(chunks_ptr + B):  # the grid holds every chunk the batch could need
        return
    d = _lower_bound(chunks_ptr + 1, B, chunk + 1)  # the document whose chunks hold this one
    rows = tl.load(bounds_ptr + d) + (chunk - tl.load(chunks_ptr + d)) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < tl.load(bounds_ptr + d + 1)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols_h = offs_h.to(tl.int64)  # strided views: offsets past 2^31 elements
    d = d.to(tl.int64)
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        cols_v = offs_v.to(tl.int64)
        arg = tl.load(arg_ptr + d * stride_w + offs_v, mask=v_ok, other=-1)
        go = tl.load(grad_ptr + d * stride_gd + cols_v * stride_gv, mask=v_ok, other=0.0)
        w = tl.load(out_ptr + d * stride_w + offs_v, mask=v_ok, other=0.0)
        g = _grad_pre(go, w, DOUBLE_LOG)
        onehot = tl.where(arg[None, :] == rows[:, None], g[None, :], 0.0)
        cols = tl.load(weight_ptr + cols_v[:, None] * stride_wv + cols_h[None, :] * stride_wh, mask=v_ok[:, None],
                       other=0.0)
        acc = tl.dot(onehot.to(cols.dtype), cols, acc, input_precision=DOT_PRECISION)
    tl.store(dh_ptr + rows[:, None].to(tl.int64) * H + offs_h[None, :], acc.to(dh_ptr.dtype.element_ty),
             mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------------- launchers

# 16-bit forward: the inference kernel's tile (256 × 128 × 64, 8 warps, 3 stages, 16-column slabs); segments of
# 1,024 rows (8 windows), 8 of them in L2 while W streams past (the inference kernel's 64 chunks of 128 rows).
FORWARD_16 = {"BLOCK_V": 256, "BLOCK_L": 128, "BLOCK_K": 64, "GROUP_S": 8, "SLAB": 16, "SEGMENT": 1024,
              "num_warps": 8, "num_stages": 3}
FORWARD_32 = {"BLOCK_V": 128, "BLOCK_L": 64, "BLOCK_K": 32, "GROUP_S": 8, "SLAB": 16, "SEGMENT": 1024,
              "num_warps": 8, "num_stages": 3}
# dW gathers rows: the row strides are specialized (a unit column stride and 16-byte aligned rows make each thread
# load 8 contiguous elements with one address); a [32, 256] tile of gathered rows a step, 8 warps (256 columns: the
# grad, output and argmax of a pair are read H / 256 times). dH: a one-hot [64, 64] tile times a [64, 256] tile of W
# a step, one warpgroup (wgmma's M = 64: a short document's chunk wastes the fewest rows).
GRAD_WEIGHT = {"BLOCK_V": 32, "BLOCK_H": 256, "num_warps": 8, "num_stages": 3}
GRAD_WEIGHT_32 = {"BLOCK_V": 32, "BLOCK_H": 128, "num_warps": 8, "num_stages": 3}
GRAD_HIDDEN = {"BLOCK_T": 64, "BLOCK_V": 64, "BLOCK_H": 256, "num_warps": 4, "num_stages": 3}
GRAD_HIDDEN_32 = {"BLOCK_T": 64, "BLOCK_V": 32, "BLOCK_H": 128, "num_warps": 4, "num_stages": 3}
# Under TRITON_INTERPRET=1: small tiles, so that small shapes cover several vocabulary, column and row blocks.
INTERPRETER_FORWARD = {"BLOCK_V": 32, "BLOCK_L": 16, "BLOCK_K": 16, "GROUP_S": 2, "SLAB": 4, "SEGMENT": 40}
INTERPRETER_GRAD_WEIGHT = {"BLOCK_V": 16, "BLOCK_H": 16}
INTERPRETER_GRAD_HIDDEN = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_H": 16}


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


def _block_h(block: int, hidden: int) -> int:
    while hidden % block:
        block //= 2
    return block


def _backward(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, start: Tensor,
              activation: str, need_hidden: bool = True, need_weight: bool = True,
              need_bias: bool = True, grads: tuple[Tensor | None, Tensor | None, Tensor | None] | None = None,
              configs: tuple[dict, dict] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(d tokens [T, H], dW [V, H], db float32 [V]); a gradient not asked for comes back empty. start: int32 [B + 1],
    each document's first row (start[B] = T).
    grads: buffers to write into (tests poison them); configs: (weight, hidden) kernel configs."""
    n_rows, hidden = tokens.shape
    n_docs, n_vocab = out.shape
    device = tokens.device
    if configs is None:
        configs = (INTERPRETER_GRAD_WEIGHT, INTERPRETER_GRAD_HIDDEN) if device.type == "cpu" else \
            (GRAD_WEIGHT_32, GRAD_HIDDEN_32) if tokens.dtype == torch.float32 else (GRAD_WEIGHT, GRAD_HIDDEN)
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
    with _on(device):
        if need_weight or need_bias:
            config = dict(configs[0])
            config["BLOCK_H"] = _block_h(config["BLOCK_H"], hidden)
            grid = (triton.cdiv(n_vocab, config["BLOCK_V"]), hidden // config["BLOCK_H"] if need_weight else 1)
            _grad_weight_kernel[grid](tokens, grad, out, arg, dw if need_weight else None, db if need_bias else None,
                                      tokens.stride(0), tokens.stride(1), *strides, n_docs, n_vocab, hidden,
                                      DOUBLE_LOG=double_log, **config)
        if need_hidden:
            config = dict(configs[1])
            config["BLOCK_H"] = _block_h(config["BLOCK_H"], hidden)
            block_t = config["BLOCK_T"]
            # chunks of BLOCK_T rows of one document each; the first document starts at row 0 and the last ends at
            # T: rows outside every document are written too (zeros). At most T / BLOCK_T + B chunks: no device sync
            bounds = start.to(device=device, dtype=torch.int32, copy=True)
            bounds[0], bounds[-1] = 0, n_rows
            chunks = torch.zeros_like(bounds)
            torch.cumsum((bounds[1:] - bounds[:-1] + block_t - 1) // block_t, 0, dtype=torch.int32, out=chunks[1:])
            grid = (triton.cdiv(n_rows, block_t) + n_docs, hidden // config["BLOCK_H"])
            _grad_hidden_kernel[grid](weight, grad, out, arg, bounds, chunks, dh, weight.stride(0), weight.stride(1),
                                      *strides, n_docs, n_vocab, hidden, DOUBLE_LOG=double_log,
                                      DOT_PRECISION=_precision(weight.dtype), **config)
    return dh, dw, db


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
def splade_max_backward_op(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, start: Tensor,
                           activation: str, need_hidden: bool, need_weight: bool,
                           need_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _backward(grad, out, arg, tokens, weight, start, activation, need_hidden, need_weight, need_bias)


@splade_max_backward_op.register_fake
def _(grad: Tensor, out: Tensor, arg: Tensor, tokens: Tensor, weight: Tensor, start: Tensor,
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
    ctx.set_materialize_grads(False)  # else autograd hands the backward an int32 [B, V] of zeros for the argmax


def _backward_padded(ctx, grad: Tensor | None, _grad_arg: None) -> tuple:
    if grad is None:
        return None, None, None, None, None
    hidden, weight, bias, out, arg = ctx.saved_tensors
    batch, seq, size = hidden.shape
    start = torch.arange(0, (batch + 1) * seq, seq, device=hidden.device, dtype=torch.int32)
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    dh, dw, db = torch.ops.sparton.splade_max_backward(grad, out, arg, hidden.reshape(batch * seq, size), weight,
                                                      start, ctx.activation, need_h, need_w,
                                                      need_b and bias is not None)
    return (dh.view(batch, seq, size) if need_h else None, dw if need_w else None, _bias_grad(db, bias), None, None)


def _setup_packed(ctx, inputs: tuple, output: tuple) -> None:
    hidden, weight, bias, cu_seqlens, _max_seqlen, activation = inputs
    out, arg = output
    ctx.save_for_backward(hidden, weight, bias, cu_seqlens, out, arg)
    ctx.activation = activation
    ctx.set_materialize_grads(False)


def _backward_packed(ctx, grad: Tensor | None, _grad_arg: None) -> tuple:
    if grad is None:
        return None, None, None, None, None, None
    hidden, weight, bias, cu_seqlens, out, arg = ctx.saved_tensors
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    dh, dw, db = torch.ops.sparton.splade_max_backward(grad, out, arg, hidden, weight, cu_seqlens,
                                                      ctx.activation, need_h, need_w, need_b and bias is not None)
    return dh if need_h else None, dw if need_w else None, _bias_grad(db, bias), None, None, None


splade_max_argmax_op.register_autograd(_backward_padded, setup_context=_setup_padded)
splade_max_packed_argmax_op.register_autograd(_backward_packed, setup_context=_setup_packed)
