"""CPU tests for sparton: the Triton kernel under Triton's interpreter, the PyTorch reference, the dispatcher.

Triton picks the interpreter when a kernel is decorated, so TRITON_INTERPRET=1 has to be set before triton's
first import in this process (tests/conftest.py sets it). If triton was imported without it, the interpreter
tests run in a fresh pytest subprocess instead (test_interpreter_suite_in_subprocess), so they are never silently
skipped, and never run twice.
Every test draws fresh random inputs; a failure message carries the seed that reproduces it.
"""

import os
import random
import subprocess
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

import sparton
from sparton import reference

head = sparton.splade_head
needs_interpreter = pytest.mark.skipif(
    head is None or not head.INTERPRETED,
    reason="triton missing, or imported before TRITON_INTERPRET=1: the subprocess test covers these",
)
TOL = {torch.float32: 3e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _inputs(seed: int, batch: int, seq: int, hidden: int, vocab: int, dtype: torch.dtype, bias: bool = True):
    """Hidden states like a LayerNorm output, logits of unit scale, bias shifted so relu zeroes a share."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=g).to(dtype)
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(dtype)
    b = (torch.randn(vocab, generator=g) - 1.0).to(dtype) if bias else None
    return h, w, b, g


def _oracle(hidden, weight, bias, mask, pooling="max", activation="log1p_relu"):
    """Dense float64 SPLADE pooling on the same (already rounded) inputs, as sentence-transformers' SpladePooling
    computes it (activate every token's logits, then pool); small shapes only."""
    logits = torch.einsum("blh,vh->blv", hidden.double(), weight.double())
    if bias is not None:
        logits = logits + bias.double()
    weights = torch.log1p(torch.relu(logits))
    if activation == "log1p_log1p_relu":
        weights = torch.log1p(weights)
    weights = weights * (mask != 0)[:, :, None]
    return weights.sum(dim=1) if pooling == "sum" else weights.amax(dim=1)


def _pack(hidden, lengths):
    """Packed [T, H] tokens and cu_seqlens from the first lengths[b] rows of each padded row."""
    tokens = torch.cat([hidden[b, :n] for b, n in enumerate(lengths)])
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return tokens, cu


def _prefix_mask(lengths, seq):
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def _check(out, ref, dtype, seed, what):
    assert out.dtype == torch.float32 and out.shape == ref.shape, what
    assert torch.isfinite(out).all(), f"{what}: unwritten or non-finite output (seed {seed})"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e} (seed {seed})"


# ---------------------------------------------------------------- the Triton kernel, under the interpreter


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("batch", "seq", "hidden", "vocab", "bias"),
    [
        (3, 37, 64, 517, True),  # V, L not multiples of any tile: chunks straddle rows
        (1, 1, 32, 100, True),  # batch 1, seq 1
        (2, 50, 48, 33, False),  # documents longer than a token block; 3 K slices; no bias
    ],
)
def test_padded_kernel_random_mask(dtype, batch, seq, hidden, vocab, bias, seed):
    h, w, b, g = _inputs(seed, batch, seq, hidden, vocab, dtype, bias)
    mask = torch.rand(batch, seq, generator=g) < 0.7  # holes anywhere: not a prefix
    mask[0, 0] = True
    if batch > 1:
        mask[-1] = False  # an all-padding row
    out = torch.full((batch, vocab), float("nan"))  # poisoned: the launcher must overwrite all of it
    head.splade_max_triton(h, w, b, mask, out=out)
    ref = _oracle(h, w, b, mask)
    _check(out, ref, dtype, seed, "padded")
    if batch > 1:
        assert (out[-1] == 0).all(), f"all-padding row must be exactly 0 (seed {seed})"


@needs_interpreter
def test_padded_kernel_prefix_int_mask_through_public_api(seed):
    """The dispatcher's custom-op path, with an int64 prefix mask (what tokenizers return)."""
    h, w, b, _ = _inputs(seed, 4, 29, 32, 77, torch.float16)
    mask = _prefix_mask([29, 1, 17, 0], 29).long()
    out = sparton.splade_max(h, w, b, mask, backend="triton")
    _check(out, _oracle(h, w, b, mask), torch.float16, seed, "public padded")
    assert (out[3] == 0).all()


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_packed_kernel_with_empty_documents(dtype, seed):
    """Zero-length documents first, between and last; a document over 3 chunks; many documents per chunk."""
    lengths = [0, 5, 40, 0, 17, 1, 0, 2, 1, 1, 3, 1, 2, 1, 1, 1, 0]
    h, w, b, _ = _inputs(seed, len(lengths), max(lengths), 64, 203, dtype)
    tokens, cu = _pack(h, lengths)
    out = torch.full((len(lengths), 203), float("nan"))
    head.splade_max_packed_triton(tokens, w, b, cu, out=out)
    ref = _oracle(h, w, b, _prefix_mask(lengths, max(lengths)))
    _check(out, ref, dtype, seed, "packed")
    assert (out[[0, 3, 6, 16]] == 0).all(), f"zero-length documents must give zero rows (seed {seed})"
    public = sparton.splade_max_packed(tokens, w, b, cu, backend="triton")
    assert torch.equal(public, out)


@needs_interpreter
@pytest.mark.parametrize("slab", [1, 4, 16])
def test_packed_kernel_slab_edges(slab, seed):
    """The epilogue streams 16-row chunks in slabs: documents that end exactly on a slab or chunk edge, empty ones
    there, documents shorter than a slab, one over several chunks; then random lengths. slab 16 = one per chunk."""
    rng = random.Random(seed)
    lengths = [4, 0, 4, 8, 0, 3, 1, 0, 16, 2, 37, 0, 5]
    lengths += [rng.choice([0, 1, 2, 3, 4, 5, 7, 9, 16, 21]) for _ in range(12)]
    h, w, b, _ = _inputs(seed, len(lengths), max(lengths), 32, 70, torch.float32)
    tokens, cu = _pack(h, lengths)
    out = torch.full((len(lengths), 70), float("nan"))
    head.splade_max_packed_triton(tokens, w, b, cu, out=out, config={**head.INTERPRETER_CONFIG, "SLAB": slab})
    _check(out, _oracle(h, w, b, _prefix_mask(lengths, max(lengths))), torch.float32, seed, f"slab {slab} {lengths}")
    empty = [i for i, n in enumerate(lengths) if n == 0]
    assert (out[empty] == 0).all(), f"zero-length documents must give zero rows (seed {seed})"


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_double_log_activation(dtype, seed):
    """log1p(log1p(relu)) is fused as the epilogue's activation: padded with holes and packed with empty
    documents, odd V and L, poisoned outputs."""
    h, w, b, g = _inputs(seed, 4, 23, 48, 131, dtype)
    mask = torch.rand(4, 23, generator=g) < 0.6
    mask[2] = False
    out = torch.full((4, 131), float("nan"))
    head.splade_max_triton(h, w, b, mask, out=out, activation="log1p_log1p_relu")
    _check(out, _oracle(h, w, b, mask, activation="log1p_log1p_relu"), dtype, seed, "padded log1p_log1p_relu")
    assert (out[2] == 0).all(), f"all-padding row must be exactly 0 (seed {seed})"
    lengths = [0, 23, 1, 7]
    tokens, cu = _pack(h, lengths)
    out = torch.full((4, 131), float("nan"))
    head.splade_max_packed_triton(tokens, w, b, cu, out=out, activation="log1p_log1p_relu")
    ref = _oracle(h, w, b, _prefix_mask(lengths, 23), activation="log1p_log1p_relu")
    _check(out, ref, dtype, seed, "packed log1p_log1p_relu")
    public = sparton.splade_max_packed(tokens, w, b, cu, backend="triton", activation="log1p_log1p_relu")
    assert torch.equal(public, out)
    single = sparton.splade_max_packed(tokens, w, b, cu, backend="triton")
    assert (single > out).any(), f"the activation flag must change the result (seed {seed})"


@needs_interpreter
@pytest.mark.parametrize("activation", sparton.ACTIVATIONS)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sum_pooling_runs_the_reference(activation, backend, seed):
    """Sum pooling is not a max: whatever the backend it runs the chunked PyTorch path, exactly."""
    h, w, b, g = _inputs(seed, 3, 19, 32, 97, torch.float32)
    mask = torch.rand(3, 19, generator=g) < 0.5
    mask[1] = False
    got = sparton.splade_max(h, w, b, mask, backend=backend, pooling="sum", activation=activation)
    _check(got, _oracle(h, w, b, mask, "sum", activation), torch.float32, seed, f"sum {activation}")
    assert (got[1] == 0).all()
    lengths = [19, 0, 4]
    tokens, cu = _pack(h, lengths)
    packed = sparton.splade_max_packed(tokens, w, b, cu, backend=backend, pooling="sum", activation=activation)
    _check(packed, _oracle(h, w, b, _prefix_mask(lengths, 19), "sum", activation), torch.float32, seed, "sum packed")


@needs_interpreter
def test_kernel_other_tile_shapes(seed):
    """Nothing may assume the default test tiles: wider tiles, a group size that does not divide B."""
    h, w, b, g = _inputs(seed, 5, 70, 64, 150, torch.float32)
    mask = torch.rand(5, 70, generator=g) < 0.5
    config = {"BLOCK_V": 64, "BLOCK_L": 32, "BLOCK_K": 32, "GROUP_L": 3}
    out = torch.full((5, 150), float("nan"))
    head.splade_max_triton(h, w, b, mask, out=out, config=config)
    _check(out, _oracle(h, w, b, mask), torch.float32, seed, "tiles 64x32x32")


@needs_interpreter
def test_kernel_rejects_what_it_cannot_do(seed):
    h, w, _, _ = _inputs(seed, 2, 4, 32, 10, torch.float32)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="bf16"):  # an interpreter limit; GPU tests cover bf16
        sparton.splade_max(h.bfloat16(), w.detach().bfloat16(), None, mask, backend="triton")
    with pytest.raises(TypeError, match="dtype"):
        sparton.splade_max(h.half(), w.detach(), None, mask, backend="triton")
    with pytest.raises(ValueError, match="multiple of 16"):
        sparton.splade_max(h[..., :24], w.detach()[:, :24], None, mask, backend="triton")
    with pytest.raises(ValueError, match="activation"):
        sparton.splade_max(h, w.detach(), None, mask, backend="triton", activation="softplus")
    with pytest.raises(ValueError, match="pooling"):
        sparton.splade_max(h, w.detach(), None, mask, backend="torch", pooling="mean")


@needs_interpreter
def test_custom_op_registration(seed):
    """The fake (meta) kernel agrees with the real one, so torch.compile can trace around the op."""
    h, w, b, _ = _inputs(seed, 2, 5, 32, 40, torch.float32)
    mask = torch.ones(2, 5, dtype=torch.bool)
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.sparton.splade_max.default, (h, w, b, mask), test_utils=utils)
    tokens, cu = _pack(h, [5, 2])
    torch.library.opcheck(
        torch.ops.sparton.splade_max_packed.default, (tokens, w, None, cu, 5), test_utils=utils
    )
    torch.library.opcheck(
        torch.ops.sparton.splade_max_packed.default, (tokens, w, b, cu, 5, "log1p_log1p_relu"), test_utils=utils
    )


@pytest.mark.skipif(
    head is None or head.INTERPRETED, reason="the interpreter tests ran in this process (or triton is missing)"
)
def test_interpreter_suite_in_subprocess():
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


# ---------------------------------------------------------------- the PyTorch reference and the dispatcher


@pytest.mark.parametrize("pooling", ["max", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_blocked_over_tokens_and_vocab(monkeypatch, dtype, pooling, seed):
    """Blocks far smaller than T and V, so both block loops and their edges are exercised (a document spans
    several token blocks). The plain path, not cpu_head's int8 screen (tests/test_sparton_cpu_head.py)."""
    monkeypatch.setattr(reference.cpu_head, "available", lambda: False)
    monkeypatch.setattr(reference, "_BLOCK_TOKENS", 5)
    monkeypatch.setattr(reference, "_BLOCK_VOCAB", 97)
    h, w, b, g = _inputs(seed, 3, 11, 16, 301, dtype)
    mask = torch.rand(3, 11, generator=g) < 0.6
    mask[1] = False
    out = sparton.splade_max_reference(h, w, b, mask, pooling=pooling)
    _check(out, _oracle(h, w, b, mask, pooling), dtype, seed, f"reference padded {pooling}")
    assert (out[1] == 0).all()
    lengths = [4, 0, 11]
    tokens, cu = _pack(h, lengths)
    packed = sparton.splade_max_packed(tokens, w, b, cu, backend="torch", pooling=pooling)
    _check(packed, _oracle(h, w, b, _prefix_mask(lengths, 11), pooling), dtype, seed, f"reference packed {pooling}")


def test_auto_backend_on_cpu_uses_reference(monkeypatch, seed):
    def boom(*args, **kwargs):
        raise AssertionError("the Triton launcher ran on CPU under backend='auto'")

    if head is not None:
        monkeypatch.setattr(head, "_launch", boom)
    h, w, b, _ = _inputs(seed, 2, 6, 16, 50, torch.float32)
    mask = torch.ones(2, 6, dtype=torch.int32)
    out = sparton.splade_max(h, w, b, mask)
    _check(out, _oracle(h, w, b, mask), torch.float32, seed, "auto on CPU")
    tokens, cu = _pack(h, [6, 3])
    assert torch.allclose(
        sparton.splade_max_packed(tokens, w, b, cu), sparton.splade_max_packed_reference(tokens, w, b, cu)
    )


@needs_interpreter
def test_triton_backend_really_runs_the_kernel(monkeypatch, seed):
    def boom(*args, **kwargs):
        raise AssertionError("backend='triton' fell back to the PyTorch reference")

    monkeypatch.setattr(sparton, "splade_max_reference", boom)
    monkeypatch.setattr(sparton, "splade_max_packed_reference", boom)
    h, w, b, _ = _inputs(seed, 1, 3, 16, 20, torch.float32)
    sparton.splade_max(h, w, b, torch.ones(1, 3), backend="triton")
    sparton.splade_max_packed(h[0], w, b, torch.tensor([0, 3], dtype=torch.int32), backend="triton")


def test_dispatcher_rejects_bad_backends(monkeypatch, seed):
    h, w, b, _ = _inputs(seed, 1, 2, 16, 8, torch.float32)
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match="backend"):
        sparton.splade_max(h, w, b, mask, backend="cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises((ValueError, RuntimeError), match="triton"):
        sparton.splade_max(h, w, b, mask, backend="triton")
