"""Sparton: the SPLADE head w[b, v] = log1p(relu(max_s H[b, s]·W[v] + bias[v])) as one fused Triton kernel.

Why: the usual head materialises the logits [B, L, V] (4 GB in fp32 at B=128, L=256, V=30,522) only to reduce
them over L. Here a [BLOCK_V, BLOCK_L] logits tile lives in registers (a GEMM tile: M = vocab, N = tokens,
K = hidden), is max-reduced over its tokens per document, and only [BLOCK_V] slices of the output are written.
Memory: output [B, V] fp32 = 4·B·V bytes plus 4 bytes per token of document ids; no [B, L, V] intermediate.
bias is constant over s and log1p∘relu is monotone, so the max runs on raw logits and bias, relu and log1p are
applied once per (document, tile) (so is the opensearch v3 models' log1p∘log1p∘relu, a compile-time flag); the
same monotonicity lets documents cut by a tile edge be combined with an atomic max of the finished values into the
zero-filled output (0 = log1p(relu(-inf)), the value of a document without a kept token).

Speed (Hopper): operands arrive by TMA; the grid is persistent (a program per SM walks the tiles). The epilogue
is what separates this kernel from a plain GEMM: it streams the tile's columns slab by slab (SLAB columns), so
a column costs one max unless a document boundary cuts its slab, and a document costs one reduction and one
write (docs/performance/sparton-head.md, "Design").

Padded and packed inputs share the kernel body: the token rows form one stream [T, H] with a non-decreasing
document id per row, cut into BLOCK_L-row chunks regardless of document boundaries, so short packed documents
waste no MMA columns. Packed: the stream is hidden itself. Padded: hidden viewed as [B·L, H] with the mask loaded
per row (any mask, prefix or not); padding rows are multiplied and then ignored, so inputs with much padding
should come packed.
"""

import contextlib
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from . import triton_key
from .activations import ACTIVATIONS


# Integer arguments are not specialized: by default Triton compiles a variant per value class of each (divisible
# by 16, equal to 1, other), so batches of new row counts and length keys would compile anew mid-run, seconds each
# (docs/performance/encode.md, "Changes kept"). No load here needs those hints: the output's row stride (V) is rarely a
# multiple of 16, and the row masks do not vectorize on T.
@triton.jit(do_not_specialize=["stride_out", "T", "V", "LEN_KEY", "ROWS_KEY"])
def _splade_max_kernel(
    # operands: TMA descriptors (rows past the end of either tensor load as zeros)
    tokens_desc,  # [T, H] token rows of all documents back to back (fp16 / bf16 / fp32), block [BLOCK_L, BLOCK_K]
    weight_desc,  # [V, H] decoder weight, same dtype, block [BLOCK_V, BLOCK_K]
    # pointers
    bias_ptr,  # [V] decoder bias, or None
    keep_ptr,  # [T] keep flags (the padded input's mask), or None: every row counts (packed input)
    doc_ptr,  # [T] int32 document of each row, non-decreasing
    start_ptr,  # [B+1] int32 first row of each document, then T
    out_ptr,  # [B, V] fp32, zero-filled by the launcher
    # strides, in elements
    stride_out,
    # sizes
    T,
    V,
    H: tl.constexpr,
    # autotuning keys only: typical document length (a power of two) and whether the call fills the GPU
    LEN_KEY,
    ROWS_KEY,
    # meta-parameters
    BLOCK_V: tl.constexpr,  # vocabulary rows per tile, the MMA's M
    BLOCK_L: tl.constexpr,  # token rows per tile, the MMA's N: a max over N is in-thread + quad shuffles
    BLOCK_K: tl.constexpr,  # hidden slice per step; divides H
    GROUP_L: tl.constexpr,  # token chunks that take turns on one W tile while it is hot in L2
    DOT_PRECISION: tl.constexpr,  # fp32 inputs: "tf32x3" keeps fp32 accuracy on the tensor cores
    SLAB: tl.constexpr,  # columns per epilogue slab (a power of two dividing BLOCK_L)
    DOUBLE_LOG: tl.constexpr,  # activation log1p(log1p(relu(x))) instead of log1p(relu(x)); compiled out when off
    FAST_LOG: tl.constexpr,  # the hardware's approximate log2 (GPU); off: a portable log1p (the interpreter's)
):
    n_chunks = tl.cdiv(T, BLOCK_L)
    per_group = GROUP_L * tl.cdiv(V, BLOCK_V)
    n_tiles = n_chunks * tl.cdiv(V, BLOCK_V)
    offs_l = tl.arange(0, BLOCK_L)
    # Persistent, not flattened: Triton 3.6 cannot fuse this tile loop with the epilogue's inner loops, and a
    # flattened (tile, K) loop gained about a percent at most before the slab epilogue
    # (docs/performance/sparton-head.md, "Design changes and what each was worth").
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        # Grouped order: GROUP_L consecutive tiles run GROUP_L token chunks against one W tile, the next
        # GROUP_L the next W tile, so the tiles in flight touch few chunks and few W tiles and both stay in L2.
        first_chunk = (tile // per_group) * GROUP_L
        group_size = tl.minimum(n_chunks - first_chunk, GROUP_L)
        row0 = (first_chunk + (tile % per_group) % group_size) * BLOCK_L
        v0 = ((tile % per_group) // group_size) * BLOCK_V
        # The tile's bookkeeping is loaded before its MMAs, so these loads (some dependent on others) are in flight
        # while the tensor cores work, not a chain of global-memory latencies in the epilogue.
        rows = row0 + offs_l
        last_row = tl.minimum(row0 + BLOCK_L, T) - 1
        first_doc = tl.load(doc_ptr + row0)
        last_doc = tl.load(doc_ptr + last_row)
        first_begin = tl.load(start_ptr + first_doc)
        first_end = tl.load(start_ptr + first_doc + 1)
        last_end = tl.load(start_ptr + last_doc + 1)
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        bias = tl.zeros((BLOCK_V,), dtype=tl.float32)
        if bias_ptr is not None:
            bias = tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        # the document of each slab's last row: how many documents end inside each slab
        marks = ()
        for s in tl.static_range(BLOCK_L // SLAB):
            marks = marks + (tl.load(doc_ptr + tl.minimum(row0 + (s + 1) * SLAB - 1, T - 1)),)
        if keep_ptr is not None:
            live = tl.load(keep_ptr + rows, mask=rows < T, other=0) != 0

        acc = tl.zeros((BLOCK_V, BLOCK_L), dtype=tl.float32)
        for k in range(0, H, BLOCK_K):
            w = weight_desc.load([v0, k])
            h = tokens_desc.load([row0, k])
            acc = tl.dot(w, h.T, acc, input_precision=DOT_PRECISION)

        # Per-document max over the chunk's columns, streamed slab by slab (SLAB columns each) in one pass: a
        # slab inside the open document costs one max per element; a slab that document boundaries cut is masked
        # once per document in it, and each document that ends there is finished and written. (A masked max over
        # the whole tile per document would cost 2 ops per element per document, and a branch per slab per
        # document costs more than the arithmetic: the epilogue is latency-bound.)
        if keep_ptr is not None:
            acc = tl.where(live[None, :], acc, float("-inf"))
        slabs = _column_slabs(acc, BLOCK_V, BLOCK_L, SLAB)
        # A document cut by the chunk's first or last row also gets tiles from the neighbouring chunk: those go in
        # by atomic max, all others by plain stores.
        cut_first = first_begin < row0
        cut_last = last_end > row0 + BLOCK_L
        first_out = out_ptr + first_doc.to(tl.int64) * stride_out + offs_v  # int64: B·V may pass 2**31
        # the open document d covers rows [begin, end); the next one ends at following. Absolute rows: a relative
        # `following` made the loop wait for its load at once, where the next use is a document later.
        d = first_doc
        begin = first_begin
        end = first_end
        following = tl.load(start_ptr + tl.minimum(d + 2, last_doc + 1))
        part = tl.full((BLOCK_V, SLAB), float("-inf"), dtype=tl.float32)
        for s in tl.static_range(BLOCK_L // SLAB):
            # documents d .. that end inside this slab (past T, all that are left)
            n_end = tl.where(row0 + (s + 1) * SLAB <= T, marks[s], last_doc + 1) - d
            if n_end == 0:
                part = tl.maximum(part, slabs[s])
            else:
                cols = row0 + s * SLAB + tl.arange(0, SLAB)
                for _ in range(n_end):  # finish and write each
                    inside = (cols >= begin) & (cols < end)
                    part = tl.maximum(part, tl.where(inside[None, :], slabs[s], float("-inf")))
                    atomic = (d == first_doc) & cut_first
                    _write(first_out + (d - first_doc) * stride_out,
                           _activate(tl.max(part, axis=1) + bias, DOUBLE_LOG, FAST_LOG), v_ok, atomic)
                    part = tl.full((BLOCK_V, SLAB), float("-inf"), dtype=tl.float32)
                    d += 1
                    begin = end
                    end = following
                    following = tl.load(start_ptr + tl.minimum(d + 2, last_doc + 1))  # in flight meanwhile
                if d <= last_doc:  # the document open past this slab
                    part = tl.maximum(part, tl.where((cols >= begin)[None, :], slabs[s], float("-inf")))
        if d <= last_doc:  # it runs past the chunk (or ends exactly at its last row)
            atomic = ((d == first_doc) & cut_first) | cut_last
            _write(first_out + (d - first_doc) * stride_out,
                   _activate(tl.max(part, axis=1) + bias, DOUBLE_LOG, FAST_LOG), v_ok, atomic)


@triton.jit
def _activate(x, DOUBLE_LOG: tl.constexpr, FAST_LOG: tl.constexpr):
    """The activation, applied once per (document, tile) to the max: both choices are monotone and map -inf to 0."""
    y = _fast_log1p_relu(x) if FAST_LOG else _log1p_relu(x)
    if DOUBLE_LOG:
        y = _fast_log1p_relu(y) if FAST_LOG else _log1p_relu(y)
    return y


@triton.jit
def _fast_log1p_relu(x):
    """log1p(relu(x)) as log2(1 + x)·ln 2 on the hardware's approximate log2 (MUFU.LG2). Why: the max is replicated
    across the 4 threads of an MMA quad, so each finished document costs every thread 4 logs, and libdevice's logf (a
    polynomial with range checks) more than doubles the per-document loop's instructions, and the packed head runs a few
    percent slower with it (docs/performance/sparton-head.md, "Design changes and what each was worth"). Differs from
    the portable path by ≤ 4.8e-7 on the benchmark's shapes (impacts are weights × 100, rounded)."""
    u = 1.0 + tl.maximum(x, 0.0)
    return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                     pack=1) * 0.6931471805599453


@triton.jit
def _log1p_relu(x):
    """log1p(relu(x)) without libdevice (the interpreter runs it too): log(u)·x/(u-1), u = 1+x, a few ulp."""
    x = tl.maximum(x, 0.0)
    u = 1.0 + x
    step = u - 1.0
    return tl.where(step == 0.0, x, tl.log(u) * (x / tl.where(step == 0.0, 1.0, step))) + 0.0  # no -0.0


@triton.jit
def _write(ptrs, w, ok, atomic):
    if atomic:
        # Non-negative floats order like their int32 bit patterns: one relaxed integer atomic per element, not
        # the float atomic's two ops with GPU-wide fences.
        tl.atomic_max(ptrs.to(tl.pointer_type(tl.int32)), w.to(tl.int32, bitcast=True), mask=ok, sem="relaxed")
    else:
        tl.store(ptrs, w, mask=ok)


@triton.jit
def _column_slabs(acc, BLOCK_V: tl.constexpr, BLOCK_L: tl.constexpr, SLAB: tl.constexpr):
    """The tile's columns as a tuple of [BLOCK_V, SLAB] slabs, by halving: the slab index sits in registers of the
    MMA layout, so reshape, permute and split only rename registers."""
    slabs = (tl.reshape(acc, [BLOCK_V, BLOCK_L // SLAB, SLAB]),)
    for _ in tl.static_range(BLOCK_L // SLAB):
        if slabs[0].shape[1] > 1:
            halves = ()
            for i in tl.static_range(len(slabs)):
                x = tl.reshape(slabs[i], [BLOCK_V, 2, slabs[i].shape[1] // 2, SLAB])
                lo, hi = tl.split(tl.permute(x, [0, 2, 3, 1]))
                halves = halves + (lo, hi)
            slabs = halves
    out = ()
    for i in tl.static_range(len(slabs)):
        out = out + (tl.reshape(slabs[i], [BLOCK_V, SLAB]),)
    return out


def _set_block_shapes(nargs: dict) -> None:
    """TMA descriptors carry their box: match it to the config being launched (autotuning tries several)."""
    nargs["tokens_desc"].block_shape = [nargs["BLOCK_L"], nargs["BLOCK_K"]]
    nargs["weight_desc"].block_shape = [nargs["BLOCK_V"], nargs["BLOCK_K"]]


def _config(bv: int, bl: int, bk: int, warps: int, stages: int, group: int = 8, slab: int = 16) -> triton.Config:
    meta = {"BLOCK_V": bv, "BLOCK_L": bl, "BLOCK_K": bk, "GROUP_L": group, "SLAB": slab}
    return triton.Config(meta, num_warps=warps, num_stages=stages, pre_hook=_set_block_shapes)


# 16-bit inputs: a tile sized for Hopper's wgmma (M = BLOCK_V ≥ 64 per warpgroup) and TMA, ≤ 200 KB of shared
# memory (stages × (BLOCK_V + BLOCK_L) × BLOCK_K × 2 bytes = 3 × 384 × 64 × 2 = 144 KB); the fp32 accumulator of a
# 256×128 tile is 128 KB of registers, the most 8 warps hold without spilling. GROUP_L = 64 chunks (8k tokens) stay
# in L2 while W streams past. One config, launched directly: on Hopper it is the fastest or within noise at every
# benchmark shape (docs/performance/sparton-head.md, "Design changes and what each was worth"), and a second one
# (128×256, 32-column slabs) only gave the autotuner's short timings a chance to pick it where it is slower.
_CONFIG_16 = _config(256, 128, 64, 8, 3, group=64, slab=16)
# fp32 inputs take twice the shared memory per element.
_CONFIGS_32 = [_config(128, 64, 32, 8, 3), _config(64, 64, 32, 4, 3)]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Keep the fp32 configs whose BLOCK_K divides H."""
    h = named_args["H"]
    kept = [c for c in configs if h % c.kwargs["BLOCK_K"] == 0]
    if not kept:
        raise ValueError(f"sparton: no tuned config fits hidden size {h}: use a multiple of 32 for fp32")
    return kept


# fp32 only. cache_results asks Triton to keep the choice on disk for fresh processes, but its autotuner (as of 3.9's
# source) skips the disk cache when a config has a pre_hook, and each of these has one (the TMA block shapes): an
# fp32 run times its two configs once per process and key. 16-bit inputs bypass the autotuner: Triton 3.6 still
# times a config that pruning left alone, in every process, for every new key, after hashing its own sources for the
# disk cache's key (a noticeable fraction of a second at the first launch; the timing waits for the GPU's queue): a
# cold run's first batches would wait on it.
_splade_max_tuned = triton.autotune(
    configs=_CONFIGS_32,
    key=["H", "V", "LEN_KEY", "ROWS_KEY"],
    prune_configs_by={"early_config_prune": _prune},
    cache_results=True,
)(_splade_max_kernel)

# Under TRITON_INTERPRET=1 (CPU tests): small tiles and few programs, so that modest shapes cover several V
# tiles, several tiles per program, chunks that cut documents, several documents per chunk and per slab, and
# several K slices.
INTERPRETER_CONFIG = {"BLOCK_V": 32, "BLOCK_L": 16, "BLOCK_K": 16, "GROUP_L": 2, "SLAB": 4}
INTERPRETER_PROGRAMS = 3
# Triton decides at decoration time, for its own functions (tl.cdiv, tl.max) too: TRITON_INTERPRET=1 must be set
# before triton is first imported.
INTERPRETED = not isinstance(tl.cdiv, triton.runtime.JITFunction)


def interpreting() -> bool:
    """True when CPU tensors can run the kernel: Triton's interpreter is on now and was at import."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    if not INTERPRETED:
        raise RuntimeError("sparton: TRITON_INTERPRET=1 was set after triton was imported; set it before")
    return True


def prepare() -> None:
    """sparton.prepare: Triton's cache key for this process, kept from an earlier one or computed (triton_key.py)."""
    triton_key.install()


def _double_log(activation: str) -> bool:
    if activation not in ACTIVATIONS:
        raise ValueError(f"sparton: activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation == "log1p_log1p_relu"


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _tma_ready(t: Tensor) -> Tensor:
    """TMA wants a unit inner stride and 16-byte aligned base and row stride; copy the rare input that is not."""
    aligned = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
    return t if aligned else t.clone(memory_format=torch.contiguous_format)


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """The inputs' GPU made current for the launch: Triton launches on the calling thread's current device and stream,
    whatever device the tensors are on (a model on cuda:1 in a process whose current device is cuda:0)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _launch(
    tokens: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    doc: Tensor,
    start: Tensor,
    n_docs: int,
    len_hint: int,
    out: Tensor | None,
    config: dict | None,
    activation: str,
) -> Tensor:
    n_rows = tokens.shape[0]
    n_vocab, hidden = weight.shape
    if tokens.dtype != weight.dtype or tokens.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"sparton: hidden, weight need one float dtype: {tokens.dtype}, {weight.dtype}")
    if tokens.shape[-1] != hidden or (bias is not None and bias.shape != (n_vocab,)):
        raise ValueError(f"sparton: shapes differ: hidden {tuple(tokens.shape)} weight {tuple(weight.shape)}")
    if hidden % 16:
        raise ValueError(f"sparton: hidden size {hidden} must be a multiple of 16")
    if tokens.device.type == "cpu" and tokens.dtype == torch.bfloat16:
        raise NotImplementedError("sparton: Triton's interpreter multiplies bf16 as raw integers; use fp16")
    if out is None:
        out = torch.zeros(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    else:
        out.zero_()
    if n_rows == 0 or n_vocab == 0:
        return out
    # block shapes are placeholders until the launched config sets them (_set_block_shapes)
    tokens_desc = TensorDescriptor.from_tensor(_tma_ready(tokens), [16, 16])
    weight_desc = TensorDescriptor.from_tensor(_tma_ready(weight), [16, 16])
    cpu = tokens.device.type == "cpu"
    sms = INTERPRETER_PROGRAMS if cpu else torch.cuda.get_device_properties(tokens.device).multi_processor_count
    args = (tokens_desc, weight_desc, bias, keep, doc, start, out, out.stride(0), n_rows, n_vocab, hidden)
    # Few keys: with fp32's two configs every new key costs a round of timing in each new process (16-bit: one
    # config, never timed).
    args += (min(_pow2(len_hint), 512), int(n_rows >= 16384))
    precision = "tf32x3" if tokens.dtype == torch.float32 else "tf32"  # ignored for 16-bit operands
    double_log = _double_log(activation)
    fast_log = tokens.is_cuda and not INTERPRETED and torch.version.hip is None  # inline PTX: not interpreted, not ROCm

    def grid(meta: dict) -> tuple[int]:
        tiles = triton.cdiv(n_rows, meta["BLOCK_L"]) * triton.cdiv(n_vocab, meta["BLOCK_V"])
        return (min(sms, tiles),)

    if config is None and not cpu and tokens.dtype == torch.float32:
        with _on(tokens.device):
            _splade_max_tuned[grid](*args, DOT_PRECISION=precision, DOUBLE_LOG=double_log, FAST_LOG=fast_log)
        return out
    if config is None and not cpu:
        if hidden % _CONFIG_16.kwargs["BLOCK_K"]:
            raise ValueError(f"sparton: no config fits hidden size {hidden}: use a multiple of 64 for 16-bit inputs")
        config = {**_CONFIG_16.kwargs, "num_warps": _CONFIG_16.num_warps, "num_stages": _CONFIG_16.num_stages}
    config = config or INTERPRETER_CONFIG
    config = {"SLAB": min(16, config["BLOCK_L"]), **config}
    config["FAST_LOG"] = fast_log and config.get("FAST_LOG", True)  # a config may turn it off, not on
    _set_block_shapes({"tokens_desc": tokens_desc, "weight_desc": weight_desc, **config})
    with _on(tokens.device):
        _splade_max_kernel[grid](*args, DOT_PRECISION=precision, DOUBLE_LOG=double_log, **config)
    return out


def splade_max_triton(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mask: Tensor,
    out: Tensor | None = None,
    config: dict | None = None,
    activation: str = "log1p_relu",
) -> Tensor:
    """Padded input: hidden [B, L, H], mask [B, L] (nonzero = keep). out and config are for tests and tuning:
    out is overwritten, config ({BLOCK_V, BLOCK_L, BLOCK_K, GROUP_L[, SLAB, FAST_LOG, num_warps, num_stages]})
    skips autotuning (FAST_LOG=False: the portable log1p on a GPU too).
    activation: "log1p_relu" or "log1p_log1p_relu"."""
    batch, seq, hidden_size = hidden.shape
    if mask.shape != (batch, seq):
        raise ValueError(f"sparton: mask {tuple(mask.shape)} does not match hidden {tuple(hidden.shape)}")
    doc = torch.arange(batch, device=hidden.device, dtype=torch.int32).repeat_interleave(seq)
    start = torch.arange(0, (batch + 1) * seq, seq, device=hidden.device, dtype=torch.int32)
    tokens = hidden.reshape(batch * seq, hidden_size)
    return _launch(tokens, weight, bias, mask.reshape(batch * seq), doc, start, batch, seq, out, config, activation)


def splade_max_packed_triton(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    out: Tensor | None = None,
    config: dict | None = None,
    activation: str = "log1p_relu",
) -> Tensor:
    """Packed input: hidden [T, H], cu_seqlens [B+1] offsets. max_seqlen, when given, keys the tile choice
    (else the mean document length does, which needs no device sync)."""
    if hidden.dim() != 2 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("sparton: packed input wants hidden [T, H] and cu_seqlens [B+1]")
    cu = cu_seqlens.to(device=hidden.device, dtype=torch.int32)
    n_docs, n_rows = cu.numel() - 1, hidden.shape[0]
    ids = torch.arange(n_docs, device=hidden.device, dtype=torch.int32)
    doc = ids.repeat_interleave(cu[1:] - cu[:-1], output_size=n_rows)  # output_size: no device sync
    len_hint = max_seqlen if max_seqlen is not None else -(-n_rows // max(1, n_docs))
    return _launch(hidden, weight, bias, None, doc, cu, n_docs, len_hint, out, config, activation)


@torch.library.custom_op("sparton::splade_max", mutates_args=())
def splade_max_op(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor, activation: str = "log1p_relu"
) -> Tensor:
    return splade_max_triton(hidden, weight, bias, mask, activation=activation)


@splade_max_op.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor, activation: str = "log1p_relu") -> Tensor:
    return hidden.new_empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32)


@torch.library.custom_op("sparton::splade_max_packed", mutates_args=())
def splade_max_packed_op(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    activation: str = "log1p_relu",
) -> Tensor:
    return splade_max_packed_triton(hidden, weight, bias, cu_seqlens, max_seqlen, activation=activation)


@splade_max_packed_op.register_fake
def _(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    activation: str = "log1p_relu",
) -> Tensor:
    return hidden.new_empty((cu_seqlens.shape[0] - 1, weight.shape[0]), dtype=torch.float32)
