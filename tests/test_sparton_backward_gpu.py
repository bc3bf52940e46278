"""GPU tests for sparton's training kernels at real shapes (pytest -m gpu tests/test_sparton_backward_gpu.py).

Two checks, kept apart so that each has a sharp bar. The forward's argmax against the float64 reference's: they may
differ only at near ties (the kernel sums in float32 in another order), where the kernel's row must hold a logit
within rounding of the maximum. The backward against float64 products from the kernel's own argmax
(reference._argmax_backward), which leaves only fp32 accumulation order and the rounding of each gradient to its
input's dtype (bf16: 2^-8 an element, fp16: 2^-11); and two backward runs must give the same bits.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparton
from sparton import reference, training

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HIDDEN = 768
TOL = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 5e-3}


def _weights(seed: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(vocab, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).to(dtype)
    b = (torch.randn(vocab, device="cuda", generator=g) - 1.0).to(dtype)
    return w, b, g


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _padded(seed: int, vocab: int, dtype: torch.dtype, batch: int = 16, seq: int = 256):
    w, b, g = _weights(seed, vocab, dtype)
    h = torch.randn(batch, seq, HIDDEN, device="cuda", generator=g).to(dtype)
    lengths = torch.randint(1, seq + 1, (batch,), device="cuda", generator=g)
    mask = torch.arange(seq, device="cuda")[None, :] < lengths[:, None]
    mask[0] &= torch.rand(seq, device="cuda", generator=g) < 0.5  # holes: not a prefix
    mask[1] = False  # all padding
    return h, w, b, mask, g


def _empty(n_docs: int) -> list[int]:
    """The zero-length documents of _packed's batches: one early, one in the middle, the last."""
    return [2, n_docs // 2, n_docs - 1]


def _packed(seed: int, vocab: int, dtype: torch.dtype, n_docs: int = 40, longest: int = 256):
    w, b, g = _weights(seed, vocab, dtype)
    cpu = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (n_docs,), generator=cpu)
    lengths[::5] = torch.randint(1, min(40, longest + 1), lengths[::5].shape, generator=cpu)  # several in a tile
    lengths[_empty(n_docs)] = 0
    cu = torch.zeros(n_docs + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    tokens = torch.randn(int(cu[-1]), HIDDEN, device="cuda", generator=g).to(dtype)
    return tokens, w, b, cu.cuda(), g


def _check_argmax(tokens: torch.Tensor, doc: torch.Tensor, n_docs: int, w, b, arg: torch.Tensor, seed: int):
    """The kernel's argmax is the float64 reference's except at near ties, where its row is within rounding of the
    maximum."""
    _, want = reference._segment_max_argmax(tokens.double(), doc.long(), n_docs, w.double(), b.double(),
                                            "log1p_relu")
    differ = (arg.long() != want).nonzero()
    assert differ.shape[0] <= 1e-4 * arg.numel() + 2, f"{differ.shape[0]} argmax disagreements (seed {seed})"
    for d, v in differ.tolist():
        got, ref = int(arg[d, v]), int(want[d, v])
        assert got >= 0 and ref >= 0, f"a document with kept tokens got no argmax (seed {seed})"
        row = w[v].double()
        a, r = tokens[got].double() @ row, tokens[ref].double() @ row
        assert abs(a - r) <= 1e-5 * (1 + abs(r)), f"({d}, {v}): row {got} logit {a} vs {ref} {r} (seed {seed})"


def _check_backward(grad, out, arg, tokens, w, start, dtype, seed, what):
    got = training._backward(grad, out, arg, tokens, w, start, "log1p_relu")
    want = reference._argmax_backward(grad.double(), out, arg.long(), tokens.double(), w.double(), "log1p_relu",
                                      (True, True, True))
    for name, value, ref in zip(("hidden", "weight", "bias"), got, want):
        assert torch.isfinite(value).all(), f"{what}: non-finite {name} gradient (seed {seed})"
        err = _rel(value, ref)
        print(f"{what} {name}: rel err {err:.2e}")
        assert err <= TOL[dtype], f"{what}: {name} gradient rel err {err:.2e} (seed {seed})"
    again = training._backward(grad, out, arg, tokens, w, start, "log1p_relu")
    assert all(torch.equal(x, y) for x, y in zip(got, again)), f"{what}: two runs differ (seed {seed})"


@pytest.mark.parametrize("vocab", [30_522, 250_002])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_padded_forward_and_backward(vocab, dtype, seed):
    """Padded 256-token documents with holes and an all-padding row."""
    h, w, b, mask, g = _padded(seed, vocab, dtype, batch=16 if dtype != torch.float32 else 8)
    batch, seq, _ = h.shape
    out, arg = training.splade_max_argmax_triton(h, w, b, mask)
    with torch.inference_mode():
        inference = sparton.splade_max(h, w, b, mask)
    assert torch.allclose(out, inference, rtol=1e-5, atol=1e-6), f"training and inference forward differ (seed {seed})"
    assert (arg[1] == -1).all() and (out[1] == 0).all(), f"all-padding row (seed {seed})"
    tokens = h.reshape(batch * seq, HIDDEN)
    doc = torch.arange(batch, device="cuda", dtype=torch.int32).repeat_interleave(seq)
    keep = mask.reshape(-1)
    kept_arg = torch.where(arg >= 0, torch.cumsum(keep, 0)[arg.long().clamp_min(0)] - 1, -1)  # rows among kept ones
    _check_argmax(tokens[keep], doc[keep], batch, w, b, kept_arg, seed)
    grad = torch.randn(batch, vocab, device="cuda", generator=g)
    start = torch.arange(0, (batch + 1) * seq, seq, device="cuda", dtype=torch.int32)
    _check_backward(grad, out, arg, tokens, w, start, dtype, seed, f"padded V={vocab} {dtype}")


@pytest.mark.parametrize("vocab", [30_522, 250_002])
@pytest.mark.parametrize(("dtype", "longest"), [(torch.bfloat16, 256), (torch.float16, 256), (torch.bfloat16, 12)])
def test_packed_forward_and_backward(vocab, dtype, longest, seed):
    """Packed documents of 0..256 tokens (several of dH's 64-row chunks each), and of 0..12 tokens (queries: 200 of
    them, one chunk each)."""
    tokens, w, b, cu, g = _packed(seed, vocab, dtype, n_docs=40 if longest > 64 else 200, longest=longest)
    n_docs = cu.numel() - 1
    out, arg = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    with torch.inference_mode():
        inference = sparton.splade_max_packed(tokens, w, b, cu)
    assert torch.allclose(out, inference, rtol=1e-5, atol=1e-6), f"seed {seed}"
    empty = _empty(n_docs)
    assert (out[empty] == 0).all() and (arg[empty] == -1).all(), f"seed {seed}"
    doc, _ = training._packed_rows(tokens, cu)
    _check_argmax(tokens, doc, n_docs, w, b, arg, seed)
    grad = torch.randn(n_docs, vocab, device="cuda", generator=g)
    _check_backward(grad, out, arg, tokens, w, cu, dtype, seed, f"packed V={vocab} {dtype}")


@pytest.mark.parametrize("packed", [False, True])
def test_poisoned_gradients_and_odd_vocabulary(packed, seed):
    """NaN-filled gradient buffers are fully written at an odd vocabulary size, bias None: packed documents, and padded
    ones of 192 rows."""
    vocab = 30_001
    if packed:
        tokens, w, _, cu, g = _packed(seed, vocab, torch.bfloat16)
        out, arg = training.splade_max_packed_argmax_triton(tokens, w, None, cu)
        start = cu
    else:
        h, w, _, mask, g = _padded(seed, vocab, torch.bfloat16, batch=6, seq=192)
        out, arg = training.splade_max_argmax_triton(h, w, None, mask)
        tokens = h.reshape(-1, HIDDEN)
        start = torch.arange(0, 7 * 192, 192, device="cuda", dtype=torch.int32)
    grad = torch.randn(out.shape, device="cuda", generator=g)
    buffers = (torch.full_like(tokens, float("nan")), torch.full_like(w, float("nan")),
               torch.full((vocab,), float("nan"), device="cuda", dtype=w.dtype))
    dh, dw, db = training._backward(grad, out, arg, tokens, w, start, "log1p_relu", grads=buffers)
    torch.cuda.synchronize()
    for name, t in (("dH", dh), ("dW", dw), ("db", db)):
        assert torch.isfinite(t).all(), f"{name}: unwritten elements (seed {seed})"


def test_ties_and_autograd_end_to_end(seed):
    """Duplicated tokens: the first copy takes every gradient. Through autograd, with an expanded upstream gradient
    (out.sum()), against the fp32 reference path on the same inputs."""
    w, b, g = _weights(seed, 30_522, torch.bfloat16)
    h = torch.randn(4, 256, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    h[0, 10] *= 3
    h[0, [77, 130, 255]] = h[0, 10].clone()  # a later slab, the next window's first row, the last row
    mask = torch.ones(4, 256, device="cuda", dtype=torch.bool)
    leaves = [t.clone().requires_grad_() for t in (h, w, b)]
    sparton.splade_max(*leaves[:2], leaves[2], mask).sum().backward()
    assert (leaves[0].grad[0, [77, 130, 255]] == 0).all(), f"a later copy got gradient (seed {seed})"
    assert leaves[0].grad[0, 10].abs().sum() > 0
    ref = [t.float().clone().requires_grad_() for t in (h, w, b)]
    sparton.splade_max(*ref[:2], ref[2], mask, backend="torch").sum().backward()
    for got, want in zip(leaves, ref):
        assert _rel(got.grad, want.grad) <= TOL[torch.bfloat16], f"seed {seed}"


def test_fp16_small_upstream_gradients_keep_their_precision(seed):
    """dW's g is computed and summed in fp32: with upstream gradients of ~2^-14 (below fp16's smallest normal once
    multiplied by the activation's slope) dW still matches the float64 products within fp16 rounding of the output."""
    tokens, w, b, cu, g = _packed(seed, 30_522, torch.float16, n_docs=12)
    out, arg = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    grad = torch.randn(out.shape, device="cuda", generator=g) * 2.0**-14
    _, dw, _ = training._backward(grad, out, arg, tokens, w, cu, "log1p_relu")
    want = reference._argmax_backward(grad.double(), out, arg.long(), tokens.double(), w.double(), "log1p_relu",
                                      (False, True, False))[1]
    assert _rel(dw, want) <= 5e-3, f"seed {seed}"


def _step(h, w, b, mask, grad) -> tuple:
    start = torch.arange(0, (h.shape[0] + 1) * h.shape[1], h.shape[1], device="cuda", dtype=torch.int32)
    out, arg = training.splade_max_argmax_triton(h, w, b, mask)
    return (out, arg, start, *training._backward(grad, out, arg, h.reshape(-1, HIDDEN), w, start, "log1p_relu"))


def extra_peak_memory(seed: int) -> int:
    """Bytes of peak memory beyond the inputs and the outputs (w, argmax, dH, dW, db) of a forward + backward at
    V=250,002, 64 documents of 256 tokens. A first step of 2 short documents pays what the libraries keep between
    steps (cuBLAS's workspace); anything sized by the batch is still new at the measured step's shapes."""
    h, w, b, mask, g = _padded(seed, 250_002, torch.bfloat16, batch=2, seq=32)
    _step(h, w, b, mask, torch.randn(2, 250_002, device="cuda", generator=g))  # its results are freed at once
    del h, w, b, mask
    h, w, b, mask, g = _padded(seed, 250_002, torch.bfloat16, batch=64)
    grad = torch.randn(64, 250_002, device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    owned = sum(t.numel() * t.element_size() for t in _step(h, w, b, mask, grad))
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before - owned


def test_memory_beyond_outputs_and_argmax(seed):
    """One training step's peak memory beyond its inputs and outputs stays within 1 MiB: no [batch, seq, vocab]
    tile and no scratch of pairs. Measured in a new process under PyTorch's default allocator: a test process whose
    earlier tests set other allocator options (the encoder's expandable segments) or left other workspaces measures
    those instead."""
    env = {k: v for k, v in os.environ.items()  # the compiled kernel, under the default allocator
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TRITON_INTERPRET")}
    here = str(Path(__file__).parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import test_sparton_backward_gpu as t; " \
           f"print(t.extra_peak_memory({seed}))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    extra = int(done.stdout.split()[-1])
    print(f"extra peak memory: {extra / 2**20:.2f} MiB")
    assert extra <= 2**20, f"{extra / 2**20:.1f} MiB beyond outputs (seed {seed})"


@pytest.mark.parametrize("packed", [False, True])
def test_torch_compile_trains_through_the_custom_ops(packed, seed):
    """A compiled training step (fullgraph) calls the training ops and their backward."""
    w, b, g = _weights(seed, 30_522, torch.bfloat16)
    w.requires_grad_()
    h = torch.randn(4, 64, HIDDEN, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    mask = torch.ones(4, 64, dtype=torch.bool, device="cuda")
    cu = torch.arange(0, 257, 64, dtype=torch.int32, device="cuda")

    def step(h, w):
        out = sparton.splade_max_packed(h.view(-1, HIDDEN), w, b, cu, 64) if packed else sparton.splade_max(h, w, b,
                                                                                                          mask)
        return (out**2).sum()

    compiled = torch.compile(step, fullgraph=True)
    compiled(h, w).backward()
    got = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    step(h, w).backward()
    assert torch.allclose(got[0].float(), h.grad.float(), rtol=1e-3, atol=1e-5)
    assert torch.allclose(got[1].float(), w.grad.float(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("hidden", [128, 384, 1024])
def test_other_hidden_sizes_with_rows_outside_every_document(hidden, seed):
    """Hidden sizes of splade-tiny's family, MiniLM's and large models (the configs' column blocks cut to fit). The
    forward takes the documents' rows (cu_seqlens from 0 to T); the backward takes them inside a buffer of fixed
    capacity whose first and last rows belong to no document: their dH is written as zeros into a poisoned buffer,
    the documents' dH does not depend on them, and every gradient matches the float64 products."""
    vocab, dtype = 30_522, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(seed)
    cpu = torch.Generator().manual_seed(seed)
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) / hidden**0.5).to(dtype)
    b = (torch.randn(vocab, device="cuda", generator=g) - 1.0).to(dtype)
    lengths = torch.randint(1, 200, (24,), generator=cpu)
    lengths[[3, 11]] = 0
    cu = torch.zeros(25, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    cu = cu.cuda()
    tokens = torch.randn(int(lengths.sum()), hidden, device="cuda", generator=g).to(dtype)
    out, arg = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    doc, _ = training._packed_rows(tokens, cu)
    _check_argmax(tokens, doc, 24, w, b, arg, seed)
    grad = torch.randn(24, vocab, device="cuda", generator=g)
    want = reference._argmax_backward(grad.double(), out, arg.long(), tokens.double(), w.double(), "log1p_relu",
                                      (True, True, True))
    got = training._backward(grad, out, arg, tokens, w, cu, "log1p_relu")
    for name, value, ref in zip(("hidden", "weight", "bias"), got, want):
        err = _rel(value, ref)
        assert torch.isfinite(value).all() and err <= TOL[dtype], f"hidden {hidden}: {name} rel err {err:.2e}"
    before, after = 37, 101
    buffer = torch.cat([torch.full((before, hidden), 50.0, device="cuda", dtype=dtype), tokens,
                        torch.full((after, hidden), 50.0, device="cuda", dtype=dtype)])
    poisoned = (torch.full_like(buffer, float("nan")), None, None)
    dh = training._backward(grad, out, torch.where(arg >= 0, arg + before, -1), buffer, w, cu + before, "log1p_relu",
                            True, False, False, grads=poisoned)[0]
    assert torch.isfinite(dh).all() and (dh[:before] == 0).all() and (dh[before + len(tokens):] == 0).all(), \
        f"seed {seed}"
    assert torch.equal(dh[before:before + len(tokens)], got[0]), f"dH depends on the rows around it (seed {seed})"
