"""Sparton: the SPLADE head w[b, v] = log1p(relu(max_s H[b, s]·W[v] + bias[v])) as one fused Triton kernel.

Why: the usual head materialises the logits [B, L, V] (4 GB in fp32 at B=128, L=256, V=30,522) only to reduce
them over L. Here a program computes a [BLOCK_V, BLOCK_L] logits tile in registers, folds it into a running
max over its document's tokens and writes one [BLOCK_V] slice of the output.
Memory: output [B, V] fp32 = 4·B·V bytes plus 8·B bytes of document bounds; no [B, L, V] intermediate.
bias is constant over s and log1p∘relu is monotone, so the max runs on raw logits and bias, relu and log1p are
applied once per output element.

Padded and packed inputs share one kernel body: a document is a row range [start, end) of a [T, H] token
matrix. Packed: the ranges come from cu_seqlens. Padded: hidden is viewed as [B·L, H] and document b spans
[b·L, b·L + extent_b), extent_b being one past its last kept position, so trailing padding costs no FLOPs;
inside the range the kernel loads the mask, so a mask with holes (not a prefix) is also exact.
"""

import os

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _splade_max_kernel(
    # pointers
    tokens_ptr,  # [T, H] hidden states (fp16 / bf16 / fp32), unit stride along H
    weight_ptr,  # [V, H] decoder weight, same dtype, unit stride along H
    bias_ptr,  # [V] decoder bias, or None
    keep_ptr,  # [T] keep flags (padded input), or None: every row of a document counts (packed input)
    starts_ptr,  # [B] int32: first row of each document in tokens
    ends_ptr,  # [B] int32: one past its last row
    out_ptr,  # [B, V] fp32
    # strides, in elements
    stride_tok,
    stride_w,
    stride_out,
    # sizes
    n_docs,
    V,
    H: tl.constexpr,
    # autotuning keys only: document length and batch size, rounded up to powers of two
    LEN_KEY,
    BATCH_KEY,
    # meta-parameters
    BLOCK_V: tl.constexpr,  # vocabulary rows per program, the MMA's M
    BLOCK_L: tl.constexpr,  # tokens per step, the MMA's N: the max over them is an in-thread + quad reduction
    BLOCK_K: tl.constexpr,  # hidden slice per step; divides H
    GROUP_B: tl.constexpr,  # documents that take turns on one W tile while it is hot in L2
    DOT_PRECISION: tl.constexpr,  # fp32 inputs: "tf32x3" keeps fp32 accuracy on the tensor cores
):
    # Grouped order: GROUP_B consecutive programs run GROUP_B documents against one W tile, the next GROUP_B
    # the next tile, so a wave of programs touches few documents and few W tiles and both stay in L2.
    pid = tl.program_id(0)
    per_group = GROUP_B * tl.cdiv(V, BLOCK_V)
    first_doc = (pid // per_group) * GROUP_B
    group_size = tl.minimum(n_docs - first_doc, GROUP_B)
    doc = first_doc + (pid % per_group) % group_size
    vt = (pid % per_group) // group_size

    start = tl.load(starts_ptr + doc).to(tl.int64)
    n_tok = tl.load(ends_ptr + doc) - start

    offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_l = tl.arange(0, BLOCK_L)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows past V wrap onto valid ones, so W loads need no mask; their results are never stored.
    w_ptrs = weight_ptr + (offs_v % V)[:, None] * stride_w + offs_k[None, :]
    tok_ptrs = tokens_ptr + (start + offs_l)[:, None] * stride_tok + offs_k[None, :]

    K_TILES: tl.constexpr = H // BLOCK_K
    tl.static_assert(K_TILES * BLOCK_K == H)
    acc = tl.zeros((BLOCK_V, BLOCK_L), dtype=tl.float32)
    peak = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    # One flat loop over (token block, hidden slice): the software pipeline keeps prefetching across token
    # blocks instead of draining at the end of each block's K loop.
    for it in range(tl.cdiv(n_tok, BLOCK_L) * K_TILES):
        ki = it % K_TILES
        l0 = (it // K_TILES) * BLOCK_L
        in_doc = l0 + offs_l < n_tok
        h = tl.load(tok_ptrs + l0 * stride_tok + ki * BLOCK_K, mask=in_doc[:, None], other=0.0)
        w = tl.load(w_ptrs + ki * BLOCK_K)
        acc = tl.dot(w, tl.trans(h), acc, input_precision=DOT_PRECISION)
        if ki == K_TILES - 1:
            if keep_ptr is not None:
                in_doc = in_doc & (tl.load(keep_ptr + start + l0 + offs_l, mask=in_doc, other=0) != 0)
            # Dropped tokens become -inf before the max, so they can never win it.
            peak = tl.maximum(peak, tl.max(tl.where(in_doc[None, :], acc, float("-inf")), axis=1))
            acc = tl.zeros((BLOCK_V, BLOCK_L), dtype=tl.float32)

    v_ok = offs_v < V
    if bias_ptr is not None:
        peak += tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
    x = tl.maximum(peak, 0.0)  # relu; a document with no kept token has peak = -inf and gets 0
    # log1p without libdevice (the interpreter runs it too): log(u)·x/(u-1), u = 1+x, is exact to a few ulp.
    u = 1.0 + x
    d = u - 1.0
    w_out = tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))
    tl.store(out_ptr + doc.to(tl.int64) * stride_out + offs_v, w_out, mask=v_ok)


def _config(bv: int, bl: int, bk: int, warps: int, stages: int, group: int = 8) -> triton.Config:
    meta = {"BLOCK_V": bv, "BLOCK_L": bl, "BLOCK_K": bk, "GROUP_B": group}
    return triton.Config(meta, num_warps=warps, num_stages=stages)


# 16-bit inputs: tiles sized for Hopper's wgmma (M = BLOCK_V ≥ 64 per warpgroup), ≤ 200 KB of shared memory.
_CONFIGS_16 = [
    _config(128, 128, 64, 8, 4),
    _config(256, 128, 64, 8, 3),
    _config(128, 256, 64, 8, 3),
    _config(256, 64, 64, 8, 4),
    _config(128, 64, 64, 4, 4),
    _config(128, 128, 64, 4, 4),
]
# fp32 inputs take twice the shared memory per element.
_CONFIGS_32 = [_config(128, 64, 32, 8, 3), _config(64, 64, 32, 4, 3)]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Keep the configs for this dtype whose BLOCK_K divides H and whose BLOCK_L a typical document fills."""
    wide = named_args["tokens_ptr"].element_size() == 4
    family = _CONFIGS_32 if wide else _CONFIGS_16
    h = named_args["H"]
    longest = max(64, named_args["LEN_KEY"])
    kept = [
        c for c in configs if c in family and h % c.kwargs["BLOCK_K"] == 0 and c.kwargs["BLOCK_L"] <= longest
    ]
    if not kept:
        raise ValueError(f"sparton: no tuned config fits hidden size {h}: use a multiple of 64 (32 for fp32)")
    return kept


_splade_max_tuned = triton.autotune(
    configs=_CONFIGS_16 + _CONFIGS_32,
    key=["H", "V", "LEN_KEY", "BATCH_KEY"],
    prune_configs_by={"early_config_prune": _prune},
)(_splade_max_kernel)

# Under TRITON_INTERPRET=1 (CPU tests): small tiles, so that modest shapes cover several V tiles, token blocks
# and K slices.
INTERPRETER_CONFIG = {"BLOCK_V": 32, "BLOCK_L": 16, "BLOCK_K": 16, "GROUP_B": 2}
# Triton decides at decoration time, for its own helpers (tl.cdiv, tl.max) too: TRITON_INTERPRET=1 must be set
# before triton is first imported.
INTERPRETED = not isinstance(tl.cdiv, triton.runtime.JITFunction)


def interpreting() -> bool:
    """True when CPU tensors can run the kernel: Triton's interpreter is on now and was at import."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    if not INTERPRETED:
        raise RuntimeError("sparton: TRITON_INTERPRET=1 was set after triton was imported; set it before")
    return True


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _launch(
    tokens: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    starts: Tensor,
    ends: Tensor,
    len_hint: int,
    out: Tensor | None,
    config: dict | None,
) -> Tensor:
    n_docs = starts.numel()
    n_vocab, hidden = weight.shape
    if tokens.dtype != weight.dtype or tokens.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"sparton: hidden and weight must share a float dtype, got {tokens.dtype}, {weight.dtype}"
        )
    if tokens.shape[-1] != hidden or (bias is not None and bias.shape != (n_vocab,)):
        raise ValueError(
            f"sparton: shapes disagree: hidden {tuple(tokens.shape)}, weight {tuple(weight.shape)}"
        )
    if hidden % 16:
        raise ValueError(f"sparton: hidden size {hidden} must be a multiple of 16")
    if tokens.device.type == "cpu" and tokens.dtype == torch.bfloat16:
        raise NotImplementedError(
            "sparton: Triton's interpreter multiplies bf16 as raw integers; use fp16/fp32"
        )
    tokens = tokens if tokens.stride(-1) == 1 else tokens.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    if out is None:
        out = torch.empty(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    if n_docs == 0 or n_vocab == 0:
        return out
    args = (tokens, weight, bias, keep, starts, ends, out)
    args += (tokens.stride(0), weight.stride(0), out.stride(0), n_docs, n_vocab, hidden)
    args += (_pow2(len_hint), _pow2(n_docs))
    precision = "tf32x3" if tokens.dtype == torch.float32 else "tf32"  # ignored for 16-bit operands

    def grid(meta: dict) -> tuple[int]:
        return (n_docs * triton.cdiv(n_vocab, meta["BLOCK_V"]),)

    if tokens.device.type == "cpu":
        _splade_max_kernel[grid](*args, DOT_PRECISION=precision, **(config or INTERPRETER_CONFIG))
    elif config is not None:
        _splade_max_kernel[grid](*args, DOT_PRECISION=precision, **config)
    else:
        _splade_max_tuned[grid](*args, DOT_PRECISION=precision)
    return out


def splade_max_triton(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mask: Tensor,
    out: Tensor | None = None,
    config: dict | None = None,
) -> Tensor:
    """Padded input: hidden [B, L, H], mask [B, L] (nonzero = keep). out and config are for tests and tuning:
    out is written in full, config ({BLOCK_V, BLOCK_L, BLOCK_K, GROUP_B[, num_warps, num_stages]}) skips
    autotuning."""
    batch, seq, hidden_size = hidden.shape
    if mask.shape != (batch, seq):
        raise ValueError(f"sparton: mask {tuple(mask.shape)} does not match hidden {tuple(hidden.shape)}")
    keep = mask.reshape(batch * seq)
    positions = torch.arange(1, seq + 1, device=hidden.device)
    extent = torch.where(mask != 0, positions, 0).amax(dim=1) if seq else positions.new_zeros(batch)
    starts = torch.arange(batch, device=hidden.device, dtype=torch.int32) * seq
    ends = starts + extent.to(torch.int32)
    tokens = hidden.reshape(batch * seq, hidden_size)
    return _launch(tokens, weight, bias, keep, starts, ends, seq, out, config)


def splade_max_packed_triton(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    out: Tensor | None = None,
    config: dict | None = None,
) -> Tensor:
    """Packed input: hidden [T, H], cu_seqlens [B+1] offsets. max_seqlen, when given, keys the tile choice
    (else the mean document length does, which needs no device sync)."""
    if hidden.dim() != 2 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("sparton: packed input wants hidden [T, H] and cu_seqlens [B+1]")
    cu = cu_seqlens.to(device=hidden.device, dtype=torch.int32)
    n_docs = cu.numel() - 1
    len_hint = max_seqlen if max_seqlen is not None else -(-hidden.shape[0] // max(1, n_docs))
    return _launch(hidden, weight, bias, None, cu[:-1], cu[1:], len_hint, out, config)


@torch.library.custom_op("sparton::splade_max", mutates_args=())
def splade_max_op(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor) -> Tensor:
    return splade_max_triton(hidden, weight, bias, mask)


@splade_max_op.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor) -> Tensor:
    return hidden.new_empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32)


@torch.library.custom_op("sparton::splade_max_packed", mutates_args=())
def splade_max_packed_op(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor, max_seqlen: int | None = None
) -> Tensor:
    return splade_max_packed_triton(hidden, weight, bias, cu_seqlens, max_seqlen)


@splade_max_packed_op.register_fake
def _(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor, max_seqlen: int | None = None
) -> Tensor:
    return hidden.new_empty((cu_seqlens.shape[0] - 1, weight.shape[0]), dtype=torch.float32)
