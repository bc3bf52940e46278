"""Experiment: the Sparton kernel warp-specialized in Gluon (Triton 3.6's API only; not used by lsr-index).

Why it exists: in the shipped Triton kernel 37% of warp stalls are the CTA barrier of the K loop (ncu,
benchmarks/NOTES_head.md), which Triton 3.6 cannot remove on Hopper (`warp_specialize` is ignored there). Gluon
can: one loader warp issues the TMA loads into a STAGES-deep ring, and two consumer warpgroups each take half of
the 256-row vocabulary tile (128 x 128 fp32 accumulator, 232 registers a thread), wait on mbarriers instead of a
CTA barrier, and release a stage with one arrive each. The loader runs ahead into the next tile while the
consumers run the epilogue, the shipped kernel's slab-streaming epilogue rewritten in Gluon (a Gluon kernel cannot
call Triton-language functions such as `tl.cdiv`, so `_column_slabs` and its neighbours are repeated here).
Shared memory: STAGES x (256 + 128) x 64 x 2 bytes = 192 KB at 4 stages.

Outcome (NOTES_head.md, "Warp specialization in Gluon"): correct on every check below; 2-6% faster than the
shipped kernel on padded input, ~1% slower on packed input. Not shipped: Gluon is experimental and this code does
not compile under Triton 3.9 (`async_copy_global_to_shared has been removed`), for a gain on the padded path only.

    python benchmarks/experiments/sparton_ws_gluon.py     # on a Hopper GPU with triton 3.6: checks, then A/B
"""

import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_head as bh  # inputs, matmul rate and floors; it loads kernels/ as `sparton`

sparton = bh.sparton


@gluon.jit
def _tile_origin(tile, n_chunks, n_vtiles, BLOCK_V: gl.constexpr, BLOCK_L: gl.constexpr, GROUP_L: gl.constexpr):
    per_group = GROUP_L * n_vtiles
    first_chunk = (tile // per_group) * GROUP_L
    group_size = gl.minimum(n_chunks - first_chunk, GROUP_L)
    row0 = (first_chunk + (tile % per_group) % group_size) * BLOCK_L
    v0 = ((tile % per_group) // group_size) * BLOCK_V
    return row0, v0


@gluon.jit
def _loader(tokens_desc, weight_desc, h_bufs, w_bufs, ready, empty, T, V,
            H: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_L: gl.constexpr, BLOCK_K: gl.constexpr,
            GROUP_L: gl.constexpr, STAGES: gl.constexpr):
    n_chunks = (T + BLOCK_L - 1) // BLOCK_L
    n_vtiles = (V + BLOCK_V - 1) // BLOCK_V
    n_tiles = n_chunks * n_vtiles
    nbytes: gl.constexpr = 2 * weight_desc.block_type.nbytes + tokens_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        row0, v0 = _tile_origin(tile, n_chunks, n_vtiles, BLOCK_V, BLOCK_L, GROUP_L)
        for k in range(0, H, BLOCK_K):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(weight_desc, [v0, k], bar, w_bufs.index(2 * s))
            tma.async_copy_global_to_shared(weight_desc, [v0 + BLOCK_V // 2, k], bar, w_bufs.index(2 * s + 1))
            tma.async_copy_global_to_shared(tokens_desc, [row0, k], bar, h_bufs.index(s))
            it += 1


@gluon.jit
def _log1p_relu(x):
    x = gl.maximum(x, 0.0)
    u = 1.0 + x
    step = u - 1.0
    return gl.where(step == 0.0, x, gl.log(u) * (x / gl.where(step == 0.0, 1.0, step))) + 0.0


@gluon.jit
def _finish(part, bias, slab_layout: gl.constexpr, row_layout: gl.constexpr):
    """A finished document's column: max over its slab, then bias, relu and log1p, in the output's layout."""
    w = _log1p_relu(gl.max(part, axis=1) + gl.convert_layout(bias, gl.SliceLayout(1, slab_layout)))
    return gl.convert_layout(w, row_layout)


@gluon.jit
def _write(ptrs, w, ok, atomic):
    if atomic:
        gl.atomic_max(ptrs.to(gl.pointer_type(gl.int32)), w.to(gl.int32, bitcast=True), mask=ok, sem="relaxed")
    else:
        gl.store(ptrs, w, mask=ok)


@gluon.jit
def _column_slabs(acc, BLOCK_V: gl.constexpr, BLOCK_L: gl.constexpr, SLAB: gl.constexpr):
    slabs = (gl.reshape(acc, [BLOCK_V, BLOCK_L // SLAB, SLAB]),)
    for _ in gl.static_range(BLOCK_L // SLAB):
        if slabs[0].shape[1] > 1:
            halves = ()
            for i in gl.static_range(len(slabs)):
                x = gl.reshape(slabs[i], [BLOCK_V, 2, slabs[i].shape[1] // 2, SLAB])
                lo, hi = gl.split(gl.permute(x, [0, 2, 3, 1]))
                halves = halves + (lo, hi)
            slabs = halves
    out = ()
    for i in gl.static_range(len(slabs)):
        out = out + (gl.reshape(slabs[i], [BLOCK_V, SLAB]),)
    return out


@gluon.jit
def _consumer(h_bufs, w_bufs, ready, empty, bias_ptr, keep_ptr, doc_ptr, start_ptr, out_ptr, stride_out, T, V,
              HALF: gl.constexpr, H: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_L: gl.constexpr,
              BLOCK_K: gl.constexpr, GROUP_L: gl.constexpr, STAGES: gl.constexpr, SLAB: gl.constexpr):
    # one warpgroup: rows [HALF * BLOCK_V/2, (HALF+1) * BLOCK_V/2) of each tile
    HV: gl.constexpr = BLOCK_V // 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_L, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    n_chunks = (T + BLOCK_L - 1) // BLOCK_L
    n_vtiles = (V + BLOCK_V - 1) // BLOCK_V
    n_tiles = n_chunks * n_vtiles
    offs_l = gl.arange(0, BLOCK_L, layout=col_layout)
    it = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        row0, v0 = _tile_origin(tile, n_chunks, n_vtiles, BLOCK_V, BLOCK_L, GROUP_L)
        rows = row0 + offs_l
        last_row = gl.minimum(row0 + BLOCK_L, T) - 1
        first_doc = gl.load(doc_ptr + row0)
        last_doc = gl.load(doc_ptr + last_row)
        first_begin = gl.load(start_ptr + first_doc)
        first_end = gl.load(start_ptr + first_doc + 1)
        last_end = gl.load(start_ptr + last_doc + 1)
        offs_v = v0 + HALF * HV + gl.arange(0, HV, layout=row_layout)
        v_ok = offs_v < V
        bias = gl.zeros([HV], gl.float32, layout=row_layout)
        if bias_ptr is not None:
            bias = gl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(gl.float32)
        marks = ()
        for m in gl.static_range(BLOCK_L // SLAB):
            marks = marks + (gl.load(doc_ptr + gl.minimum(row0 + (m + 1) * SLAB - 1, T - 1)),)
        if keep_ptr is not None:
            live = gl.load(keep_ptr + rows, mask=rows < T, other=0) != 0

        acc = gl.zeros([HV, BLOCK_L], gl.float32, layout=acc_layout)
        for k in range(0, H, BLOCK_K):
            st = it % STAGES
            mbarrier.wait(ready.index(st), (it // STAGES) & 1)
            acc = warpgroup_mma(w_bufs.index(2 * st + HALF), h_bufs.index(st).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=k > 0)
            it += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1)

        if keep_ptr is not None:
            acc = gl.where(live[None, :], acc, float("-inf"))
        slabs = _column_slabs(acc, HV, BLOCK_L, SLAB)
        slab_layout: gl.constexpr = slabs[0].type.layout
        cut_first = first_begin < row0
        cut_last = last_end > row0 + BLOCK_L
        first_out = out_ptr + first_doc.to(gl.int64) * stride_out + offs_v
        d = first_doc
        begin = first_begin - row0
        end = first_end - row0
        following = gl.load(start_ptr + gl.minimum(d + 2, last_doc + 1)) - row0
        part = gl.full([HV, SLAB], float("-inf"), gl.float32, layout=slab_layout)
        for s in gl.static_range(BLOCK_L // SLAB):
            n_end = gl.where(row0 + (s + 1) * SLAB <= T, marks[s], last_doc + 1) - d
            if n_end == 0:
                part = gl.maximum(part, slabs[s])
            else:
                cols = s * SLAB + gl.arange(0, SLAB, layout=gl.SliceLayout(0, slab_layout))
                for _ in range(n_end):
                    inside = (cols >= begin) & (cols < end)
                    part = gl.maximum(part, gl.where(inside[None, :], slabs[s], float("-inf")))
                    atomic = (d == first_doc) & cut_first
                    w = _finish(part, bias, slab_layout, row_layout)
                    _write(first_out + (d - first_doc) * stride_out, w, v_ok, atomic)
                    part = gl.full([HV, SLAB], float("-inf"), gl.float32, layout=slab_layout)
                    d += 1
                    begin = end
                    end = following
                    following = gl.load(start_ptr + gl.minimum(d + 2, last_doc + 1)) - row0
                if d <= last_doc:
                    part = gl.maximum(part, gl.where((cols >= begin)[None, :], slabs[s], float("-inf")))
        if d <= last_doc:
            atomic = ((d == first_doc) & cut_first) | cut_last
            w = _finish(part, bias, slab_layout, row_layout)
            _write(first_out + (d - first_doc) * stride_out, w, v_ok, atomic)


@gluon.jit
def _splade_max_ws_kernel(
    tokens_desc, weight_desc,  # TMA: [T, H] block [BLOCK_L, BLOCK_K]; [V, H] block [BLOCK_V/2, BLOCK_K]
    bias_ptr, keep_ptr, doc_ptr, start_ptr, out_ptr,
    stride_out, T, V,
    H: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_L: gl.constexpr, BLOCK_K: gl.constexpr,
    GROUP_L: gl.constexpr, STAGES: gl.constexpr, SLAB: gl.constexpr,
):
    h_bufs = gl.allocate_shared_memory(tokens_desc.dtype, [STAGES] + tokens_desc.block_type.shape, tokens_desc.layout)
    w_bufs = gl.allocate_shared_memory(weight_desc.dtype, [2 * STAGES] + weight_desc.block_type.shape,
                                       weight_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (h_bufs, w_bufs, ready, empty, bias_ptr, keep_ptr, doc_ptr, start_ptr, out_ptr, stride_out, T, V,
                     0, H, BLOCK_V, BLOCK_L, BLOCK_K, GROUP_L, STAGES, SLAB)),
        (_consumer, (h_bufs, w_bufs, ready, empty, bias_ptr, keep_ptr, doc_ptr, start_ptr, out_ptr, stride_out, T, V,
                     1, H, BLOCK_V, BLOCK_L, BLOCK_K, GROUP_L, STAGES, SLAB)),
        (_loader, (tokens_desc, weight_desc, h_bufs, w_bufs, ready, empty, T, V,
                   H, BLOCK_V, BLOCK_L, BLOCK_K, GROUP_L, STAGES)),
    ], [4, 1], [232, 40])


def _launch(tokens: Tensor, weight: Tensor, bias: Tensor | None, keep: Tensor | None, doc: Tensor,
            start: Tensor, n_docs: int, group: int = 64, stages: int = 4) -> Tensor:
    block_v, block_l, block_k = 256, 128, 64
    n_rows, hidden = tokens.shape
    n_vocab = weight.shape[0]
    out = torch.zeros(n_docs, n_vocab, dtype=torch.float32, device=tokens.device)
    dtype = gl.bfloat16 if tokens.dtype == torch.bfloat16 else gl.float16
    tokens_desc = TensorDescriptor.from_tensor(
        tokens, [block_l, block_k], gl.NVMMASharedLayout.get_default_for([block_l, block_k], dtype))
    weight_desc = TensorDescriptor.from_tensor(
        weight, [block_v // 2, block_k], gl.NVMMASharedLayout.get_default_for([block_v // 2, block_k], dtype))
    sms = torch.cuda.get_device_properties(tokens.device).multi_processor_count
    tiles = triton.cdiv(n_rows, block_l) * triton.cdiv(n_vocab, block_v)
    # 168 registers x 3 warpgroups at launch; setmaxnreg then gives the loader 40 and each consumer 232
    _splade_max_ws_kernel[(min(sms, tiles),)](
        tokens_desc, weight_desc, bias, keep, doc, start, out, out.stride(0), n_rows, n_vocab,
        hidden, block_v, block_l, block_k, group, stages, 16, num_warps=4, maxnreg=168)
    return out


def splade_max_ws(hidden: Tensor, weight: Tensor, bias: Tensor | None, mask: Tensor, **kw: int) -> Tensor:
    batch, seq, h = hidden.shape
    doc = torch.arange(batch, device=hidden.device, dtype=torch.int32).repeat_interleave(seq)
    start = torch.arange(0, (batch + 1) * seq, seq, device=hidden.device, dtype=torch.int32)
    return _launch(hidden.reshape(batch * seq, h), weight, bias, mask.reshape(-1), doc, start, batch, **kw)


def splade_max_packed_ws(hidden: Tensor, weight: Tensor, bias: Tensor | None, cu: Tensor, **kw: int) -> Tensor:
    cu = cu.to(torch.int32)
    n_docs, n_rows = cu.numel() - 1, hidden.shape[0]
    ids = torch.arange(n_docs, device=hidden.device, dtype=torch.int32)
    doc = ids.repeat_interleave(cu[1:] - cu[:-1], output_size=n_rows)
    return _launch(hidden, weight, bias, None, doc, cu, n_docs, **kw)


def check() -> bool:
    """Against the float32 reference on fresh inputs: odd lengths, a padding row, documents longer than a tile."""
    from sparton.reference import splade_max_packed_reference, splade_max_reference

    seed = int(time.time())
    g = torch.Generator(device="cuda").manual_seed(seed)
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        for vocab in (1000, 30_522):
            w = torch.randn(vocab, 768, device="cuda", dtype=dtype, generator=g) / 768**0.5
            b = torch.randn(vocab, device="cuda", dtype=dtype, generator=g) - 1.0
            cases = []
            for batch, seq in ((7, 300), (1, 1), (3, 129)):
                h = torch.randn(batch, seq, 768, device="cuda", dtype=dtype, generator=g)
                lens = torch.randint(1, seq + 1, (batch,), device="cuda", generator=g)
                mask = (torch.arange(seq, device="cuda")[None] < lens[:, None]).to(dtype)
                if batch > 2:
                    mask[batch // 2] = 0  # a document of padding only (its reference row is all zeros)
                ref = splade_max_reference(h.float(), w.float(), b.float(), mask)
                cases.append((f"padded B={batch} L={seq}", splade_max_ws(h, w, b, mask), ref))
            lengths = torch.randint(1, 301, (40,), generator=torch.Generator().manual_seed(seed))
            cu = torch.zeros(41, dtype=torch.int32)
            cu[1:] = lengths.cumsum(0)
            h = torch.randn(int(cu[-1]), 768, device="cuda", dtype=dtype, generator=g)
            cu = cu.cuda()
            ref = splade_max_packed_reference(h.float(), w.float(), b.float(), cu)
            cases.append((f"packed T={int(cu[-1])}", splade_max_packed_ws(h, w, b, cu), ref))
            for name, got, ref in cases:
                err = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                good = err <= 1e-2 and bool(torch.isfinite(got).all())
                ok &= good
                print(f"check {str(dtype)[6:]} V={vocab} {name}: rel err {err:.1e} {'ok' if good else 'FAIL'}")
    return ok


def ab() -> None:
    """Shipped kernel vs this one, three interleaved rounds, each timing after 300 ms of warm-up (power cap)."""
    rate, _ = bh.matmul_peak_tflops(warmup_ms=2000)
    print(f"bf16 matmul, warm: {rate:.0f} TFLOP/s")
    cases = [("padded", 30_522, 128, torch.float16), ("padded", 250_002, 128, torch.float16),
             ("padded", 30_522, 512, torch.bfloat16), ("packed", 30_522, 32_768, torch.bfloat16)]
    for kind, vocab, n, dtype in cases:
        if kind == "padded":
            h, w, b, m = bh.make_inputs(n, vocab, dtype)
            tokens = n * bh.SEQ
            fns = {"shipped": partial(sparton.splade_max, h, w, b, m), "ws": partial(splade_max_ws, h, w, b, m)}
        else:
            h, cu, longest = bh.packed_inputs(n, dtype)
            _, w, b, _ = bh.make_inputs(1, vocab, dtype)
            tokens = h.shape[0]
            fns = {"shipped": partial(sparton.splade_max_packed, h, w, b, cu, longest),
                   "ws": partial(splade_max_packed_ws, h, w, b, cu)}
        times = {k: [] for k in fns}
        for _ in range(3):
            for k, f in fns.items():
                times[k].append(bh.measure(f)["ms"])
        floor = bh.floor_ms(tokens, vocab, rate)
        print(f"{kind} V={vocab} n={n} {str(dtype)[6:]}: " + "  ".join(
            f"{k} {'/'.join(f'{t:.3f}' for t in v)} ms (best {min(v) / floor:.3f}x floor)" for k, v in times.items()))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        sys.exit("needs a Hopper GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    if check():
        ab()
    else:
        sys.exit("checks failed")
