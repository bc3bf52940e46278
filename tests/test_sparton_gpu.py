"""GPU tests for sparton's Triton kernel at real shapes (on a GPU: pytest -m gpu tests/test_sparton_gpu.py).

The oracle is the chunked reference in float64 on the same rounded inputs, so the only expected difference is
fp32 accumulation order (about 1e-6); the bars below are far looser than that and far tighter than one
dropped or extra token would allow.
"""


import pytest
import torch

import sparton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TOL = {torch.float32: 3e-4, torch.float16: 1e-3, torch.bfloat16: 1e-3}
HIDDEN = 768


def _weights(seed: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(vocab, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).to(dtype)
    b = (torch.randn(vocab, device="cuda", generator=g) - 1.0).to(dtype)
    return w, b, g


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("vocab", [30_522, 250_002])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_padded_real_shapes(vocab, dtype, seed):
    batch, seq = (64, 256) if dtype != torch.float32 else (16, 256)
    w, b, g = _weights(seed, vocab, dtype)
    h = torch.randn(batch, seq, HIDDEN, device="cuda", generator=g).to(dtype)
    lengths = torch.randint(1, seq + 1, (batch,), device="cuda", generator=g)
    mask = torch.arange(seq, device="cuda")[None, :] < lengths[:, None]
    mask[0] &= torch.rand(seq, device="cuda", generator=g) < 0.5  # one row with holes: not a prefix
    mask[1] = False  # an all-padding row
    mask[2] = True  # a full row
    with torch.inference_mode():
        out = sparton.splade_max(h, w, b, mask)
        ref = sparton.splade_max_reference(h.double(), w.double(), b.double(), mask)
    torch.cuda.synchronize()
    assert out.shape == (batch, vocab) and out.dtype == torch.float32
    assert torch.isfinite(out).all(), f"seed {seed}"
    err = _rel_err(out, ref)
    print(f"padded V={vocab} {dtype}: rel err {err:.2e}")
    assert err <= TOL[dtype], f"rel err {err:.2e} (seed {seed})"
    assert (out[1] == 0).all(), f"all-padding row (seed {seed})"


@pytest.mark.parametrize("vocab", [30_522, 250_002])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_real_shapes(vocab, dtype, seed):
    w, b, g = _weights(seed, vocab, dtype)
    cpu = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 257, (48,), generator=cpu)
    lengths[::7] = torch.randint(1, 90, lengths[::7].shape, generator=cpu)  # many short documents
    lengths[[3, 20, 47]] = 0  # zero-length documents, the last one too
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    cu = cu.cuda()
    tokens = torch.randn(int(lengths.sum()), HIDDEN, device="cuda", generator=g).to(dtype)
    with torch.inference_mode():
        out = sparton.splade_max_packed(tokens, w, b, cu, int(lengths.max()))
        ref = sparton.splade_max_packed_reference(tokens.double(), w.double(), b.double(), cu)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"seed {seed}"
    err = _rel_err(out, ref)
    print(f"packed V={vocab} {dtype}: rel err {err:.2e}")
    assert err <= TOL[dtype], f"rel err {err:.2e} (seed {seed})"
    assert (out[[3, 20, 47]] == 0).all(), f"zero-length documents (seed {seed})"


def test_poisoned_output_and_no_bias(seed):
    """Every element written into a NaN-filled buffer; bias None; padded and packed agree on one batch."""
    w, _, g = _weights(seed, 30_522, torch.bfloat16)
    h = torch.randn(7, 200, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    lengths = [200, 1, 0, 133, 64, 65, 199]
    mask = torch.arange(200, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    out = torch.full((7, 30_522), float("nan"), device="cuda")
    with torch.inference_mode():
        sparton.splade_head.splade_max_triton(h, w, None, mask, out=out)
        tokens = h[mask]
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        packed = sparton.splade_max_packed(tokens, w, None, cu)
        ref = sparton.splade_max_reference(h.double(), w.double(), None, mask)
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert _rel_err(out, ref) <= TOL[torch.bfloat16], f"seed {seed}"
    # Tile shapes may differ between the two (their autotuning keys differ), hence allclose, not equal.
    assert torch.allclose(out, packed, rtol=1e-5, atol=1e-6), f"padded and packed disagree (seed {seed})"


@pytest.mark.parametrize(("pooling", "activation"), [("max", "log1p_log1p_relu"), ("sum", "log1p_relu")])
def test_pooling_variants(pooling, activation, seed):
    """The fused double log (opensearch v3) and sum pooling (the chunked PyTorch path on CUDA) at a ModernBERT-sized
    vocabulary with packed documents."""
    w, b, g = _weights(seed, 50_368, torch.bfloat16)
    lengths = [0, 200, 1, 77, 128, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tokens = torch.randn(sum(lengths), HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    options = {"pooling": pooling, "activation": activation}
    with torch.inference_mode():
        out = sparton.splade_max_packed(tokens, w, b, cu, max(lengths), **options)
        ref = sparton.splade_max_packed_reference(tokens.double(), w.double(), b.double(), cu, **options)
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert _rel_err(out, ref) <= TOL[torch.bfloat16], f"seed {seed}"
    assert (out[0] == 0).all(), f"zero-length document (seed {seed})"


@pytest.mark.parametrize("activation", ["log1p_relu", "log1p_log1p_relu"])
def test_the_hardware_log_stays_within_a_few_ulp_of_the_portable_one(activation, seed):
    """The GPU path's activation uses the hardware's approximate log2; the same launch with FAST_LOG off takes the
    portable log1p (the interpreter's): on logits up to ~20 the two agree to well below an impact's resolution."""
    w, b, g = _weights(seed, 30_522, torch.bfloat16)
    lengths = [37, 0, 300, 1, 128, 129, 60]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tokens = (6 * torch.randn(sum(lengths), HIDDEN, device="cuda", generator=g)).to(torch.bfloat16)
    tile = sparton.splade_head._CONFIG_16
    portable = {**tile.kwargs, "num_warps": tile.num_warps, "num_stages": tile.num_stages, "FAST_LOG": False}
    head = sparton.splade_head.splade_max_packed_triton
    with torch.inference_mode():
        fast = head(tokens, w, b, cu, activation=activation)
        slow = head(tokens, w, b, cu, config=portable, activation=activation)
        ref = sparton.splade_max_packed_reference(tokens.double(), w.double(), b.double(), cu, activation=activation)
    assert slow.max() > 2.5 if activation == "log1p_relu" else slow.max() > 1.2, "the logits span too little"
    assert torch.allclose(fast, slow, rtol=5e-7, atol=1e-6), f"max diff {(fast - slow).abs().max():.2e} (seed {seed})"
    assert _rel_err(fast, ref) <= 1e-5 and _rel_err(slow, ref) <= 1e-5, f"seed {seed}"


def test_torch_compile_traces_the_custom_op(seed):
    w, b, g = _weights(seed, 30_522, torch.bfloat16)
    h = torch.randn(4, 64, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    mask = torch.ones(4, 64, dtype=torch.bool, device="cuda")
    fn = torch.compile(lambda h, m: sparton.splade_max(h, w, b, m) * 2.0, fullgraph=True)
    with torch.inference_mode():
        assert torch.allclose(fn(h, mask), 2.0 * sparton.splade_max(h, w, b, mask))


def test_inference_calls_run_the_inference_kernel(monkeypatch, seed):
    """Without a gradient to compute (inference mode, no_grad, or no input requiring one) the inference kernel runs
    and no argmax is written; with one, the training kernel (tests/test_sparton_backward_gpu.py)."""
    def boom(*args, **kwargs):
        raise AssertionError("the training forward ran without a gradient to compute")

    monkeypatch.setattr(sparton.training, "_forward", boom)
    w, b, g = _weights(seed, 1_000, torch.bfloat16)
    h = torch.randn(2, 8, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    mask = torch.ones(2, 8, device="cuda")
    sparton.splade_max(h, w, b, mask)
    with torch.no_grad():
        sparton.splade_max(h.requires_grad_(), w, b, mask)
    with torch.inference_mode():
        sparton.splade_max(h, w, b, mask)
