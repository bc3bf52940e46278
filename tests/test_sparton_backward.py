"""CPU tests for sparton's gradients: the Triton training forward and backward under Triton's interpreter, the
differentiable PyTorch reference, and the dispatcher's choice between the inference and training kernels.

The oracle is dense float64 autograd over the full logits on the same (already rounded) inputs, with the tie rule
written out: each (document, term) takes the lowest kept row among those with the maximal logit (torch.argmax
returns the first maximal index), and the gradient reaches that row only (through gather). Random inputs are fresh
per test (the seed fixture); a pair whose two best logits are within rounding of each other may be decided either way
by a kernel that sums in another order, so there the oracle follows the kernel's choice once it has checked that the
chosen row's logit is within rounding of the maximum. Exact ties (duplicated token rows) are tested separately,
without that allowance.
"""

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

import sparton
from sparton import reference

head = sparton.splade_head
training = sparton.training
needs_interpreter = pytest.mark.skipif(
    head is None or not head.INTERPRETED,
    reason="triton missing, or imported before TRITON_INTERPRET=1 (tests/test_sparton.py's subprocess test runs "
    "the interpreter tests of that file only)",
)
# relative error of a gradient against the float64 oracle: the kernels gather 16-bit inputs exactly and sum in fp32, in
# another order, then round the gradient to the input's dtype (fp16: 2^-11 an element); the bf16 reference rounds its
# products to bf16
TOL = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 2e-2}
NEAR = 1e-5  # relative gap under which two logits count as a near tie for a float32-accumulating kernel


def _inputs(seed: int, batch: int, seq: int, hidden: int, vocab: int, dtype: torch.dtype, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=g).to(dtype)
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(dtype)
    b = (torch.randn(vocab, generator=g) - 0.5).to(dtype) if bias else None
    return h, w, b, g


def _pack(hidden, lengths):
    tokens = torch.cat([hidden[b, :n] for b, n in enumerate(lengths)])
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return tokens, cu


def _prefix_mask(lengths, seq):
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def _oracle(hidden, weight, bias, mask, grad, activation="log1p_relu", choice=None):
    """(w, argmax [B, V] as positions in the sequence (-1: no kept token), dH, dW, db) in float64, padded layout.
    choice: a kernel's argmax positions, followed where the float64 logits are in a near tie."""
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    b = bias.double().requires_grad_() if bias is not None else None
    keep = (mask != 0)[:, :, None]
    logits = torch.einsum("blh,vh->blv", h, w).masked_fill(~keep, float("-inf"))
    arg = logits.detach().argmax(dim=1)  # the first maximal position: the lowest row wins a tie
    if choice is not None and logits.shape[1] > 1:
        top = logits.detach().topk(2, dim=1).values
        near = (top[:, 0] - top[:, 1]).abs() <= NEAR * (1 + top[:, 0].abs())
        near &= torch.isfinite(top[:, 1])
        picked = logits.detach().gather(1, choice.clamp_min(0)[:, None]).squeeze(1)
        assert ((picked >= top[:, 0] - 2 * NEAR * (1 + top[:, 0].abs())) | ~near).all(), "a chosen row is no maximum"
        arg = torch.where(near, choice, arg)
    pre = logits.gather(1, arg[:, None]).squeeze(1)
    if b is not None:
        pre = pre + b
    out = torch.log1p(torch.relu(pre))
    if activation == "log1p_log1p_relu":
        out = torch.log1p(out)
    out.backward(grad.double())
    empty = ~keep.any(1)
    arg = torch.where(empty, -1, arg)
    return out.detach(), arg, h.grad, w.grad, b.grad if b is not None else None


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _check_grads(got, want, dtype, seed, what):
    for name, a, r in zip(("hidden", "weight", "bias"), got, want):
        if r is None:
            assert a is None, f"{what}: {name} got a gradient it should not have"
            continue
        assert a is not None and a.shape == r.shape, f"{what}: {name} gradient missing or misshapen"
        assert torch.isfinite(a).all(), f"{what}: non-finite {name} gradient (seed {seed})"
        err = _rel(a, r)
        assert err <= TOL[dtype], f"{what}: {name} gradient rel err {err:.2e} > {TOL[dtype]:.0e} (seed {seed})"


def _positions(arg_rows, seq):
    """Kernel argmax rows of the [B·L] stream → positions in each sequence (-1 stays)."""
    return torch.where(arg_rows >= 0, arg_rows % seq, -1).long()


def _run(fn, h, w, b, grad):
    """Gradients of (fn(h, w, b) · grad).sum() for leaf copies of h, w, b."""
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    b = b.clone().requires_grad_() if b is not None else None
    out = fn(h, w, b)
    (out * grad).sum().backward()
    return out.detach(), (h.grad, w.grad, b.grad if b is not None else None)


# ---------------------------------------------------------------- the Triton training kernels, under the interpreter


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("batch", "seq", "hidden", "vocab", "bias"), [(3, 37, 32, 71, True), (2, 19, 48, 33, False)])
def test_padded_gradients_against_the_oracle(dtype, batch, seq, hidden, vocab, bias, seed):
    """Random mask with holes, an all-padding row, odd L and V, several windows, segments and vocabulary tiles."""
    h, w, b, g = _inputs(seed, batch, seq, hidden, vocab, dtype, bias)
    mask = torch.rand(batch, seq, generator=g) < 0.7
    mask[0, 0] = True
    mask[-1] = False
    grad = torch.randn(batch, vocab, generator=g)
    out, grads = _run(lambda h, w, b: sparton.splade_max(h, w, b, mask, backend="triton"), h, w, b, grad)
    _, arg = training.splade_max_argmax_triton(h, w, b, mask)
    want = _oracle(h, w, b, mask, grad, choice=_positions(arg, seq))
    assert out.dtype == torch.float32 and _rel(out, want[0]) <= 1e-5, f"forward (seed {seed})"
    assert torch.equal(_positions(arg, seq), want[1]), f"argmax (seed {seed})"
    assert (arg[-1] == -1).all() and (out[-1] == 0).all(), f"all-padding row (seed {seed})"
    _check_grads(grads, want[2:], dtype, seed, "padded")
    assert (grads[0][~mask] == 0).all(), f"padding rows must get no gradient (seed {seed})"


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_packed_gradients_with_empty_documents(dtype, seed):
    """Zero-length documents first, between and last; a document over several windows and segments; many short
    documents in one window; the packed custom op through the public API."""
    lengths = [0, 5, 43, 0, 17, 1, 0, 2, 1, 1, 3, 9, 0]
    seq = max(lengths)
    h, w, b, g = _inputs(seed, len(lengths), seq, 32, 57, dtype)
    tokens, cu = _pack(h, lengths)
    grad = torch.randn(len(lengths), 57, generator=g)
    out, grads = _run(lambda t, w, b: sparton.splade_max_packed(t, w, b, cu, seq, backend="triton"), tokens, w, b,
                      grad)
    _, arg = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    starts = cu[:-1].long()[:, None]
    mask = _prefix_mask(lengths, seq)
    want = _oracle(h, w, b, mask, grad, choice=torch.where(arg >= 0, arg - starts, -1).long())
    assert _rel(out, want[0]) <= 1e-5, f"forward (seed {seed})"
    empty = [i for i, n in enumerate(lengths) if n == 0]
    assert (out[empty] == 0).all() and (arg[empty] == -1).all(), f"zero-length documents (seed {seed})"
    _check_grads((grads[0], grads[1], grads[2]), (want[2][mask], want[3], want[4]), dtype, seed, "packed")


@needs_interpreter
@pytest.mark.parametrize("activation", sparton.ACTIVATIONS)
def test_both_activations_and_the_inference_kernel_agree(activation, seed):
    """The training forward's values are the inference kernel's; both activations' derivatives."""
    h, w, b, g = _inputs(seed, 4, 23, 32, 45, torch.float32)
    mask = torch.rand(4, 23, generator=g) < 0.6
    mask[2] = False
    grad = torch.randn(4, 45, generator=g)
    out, arg = training.splade_max_argmax_triton(h, w, b, mask, activation)
    inference = head.splade_max_triton(h, w, b, mask, activation=activation)
    assert torch.allclose(out, inference, rtol=1e-6, atol=1e-7), f"seed {seed}"
    _, grads = _run(lambda h, w, b: sparton.splade_max(h, w, b, mask, backend="triton", activation=activation),
                    h, w, b, grad)
    want = _oracle(h, w, b, mask, grad, activation, choice=_positions(arg, 23))
    _check_grads(grads, want[2:], torch.float32, seed, activation)


def _tied(seed: int, dtype: torch.dtype, seq: int, copies: dict[int, list[int]]):
    """Inputs whose row `src` is copied to each row of copies[src] in document 0, scaled up so that it holds the max
    of many terms whatever the seed (at 8x a row beats the other rows' best wherever its own score is clearly
    positive: about a third of the terms each; at 3x some seeds left one row two): every such term is an exact tie
    between the copies."""
    h, w, b, g = _inputs(seed, 2, seq, 32, 40, dtype)
    for src, dsts in copies.items():
        h[0, src] = (8 * h[0, src].float()).to(dtype)
        for dst in dsts:
            h[0, dst] = h[0, src]
    return h, w, b, g


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ties_go_to_the_lowest_row(dtype, seed):
    """Duplicated token rows in one slab, across slabs, windows (16 rows) and segments (40 rows): the argmax is the
    first copy, every gradient goes to it and none to the later copies, as in the oracle (no near-tie allowance)."""
    seq = 90
    copies = {3: [5, 13, 21, 60], 30: [47, 85]}
    h, w, b, g = _tied(seed, dtype, seq, copies)
    mask = torch.ones(2, seq, dtype=torch.bool)
    grad = torch.randn(2, 40, generator=g)
    _, grads = _run(lambda h, w, b: sparton.splade_max(h, w, b, mask, backend="triton"), h, w, b, grad)
    _, arg = training.splade_max_argmax_triton(h, w, b, mask)
    want = _oracle(h, w, b, mask, grad)
    assert torch.equal(_positions(arg, seq), want[1]), f"argmax under exact ties (seed {seed})"
    for src, dsts in copies.items():
        assert (want[1][0] == src).sum() > 2, "the construction must make the copies hold maxima"
        assert (grads[0][0, dsts] == 0).all(), f"a later copy got gradient (seed {seed})"
    _check_grads(grads, want[2:], dtype, seed, "ties")
    # packed, with the tied document in the middle of others
    tokens, cu = _pack(torch.cat([h[1:], h[:1], h[1:]]), [7, seq, 11])
    grad3 = torch.randn(3, 40, generator=g)
    _, arg3 = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    assert torch.equal(arg3[1].long() - 7, want[1][0]), f"packed argmax under exact ties (seed {seed})"
    _, grads3 = _run(lambda t, w, b: sparton.splade_max_packed(t, w, b, cu, backend="triton"), tokens, w, b, grad3)
    assert (grads3[0][[7 + d for dsts in copies.values() for d in dsts]] == 0).all(), f"packed ties (seed {seed})"


@needs_interpreter
@pytest.mark.parametrize("packed", [False, True])
def test_poisoned_gradient_buffers_are_fully_written(packed, seed):
    """NaN-filled dH, dW, db: the kernels must write every element (padding rows, rows of empty documents and terms
    nobody's argmax reaches included), the same bits twice."""
    h, w, b, g = _inputs(seed, 3, 32, 32, 51, torch.float32)
    mask = torch.rand(3, 32, generator=g) < 0.5
    mask[1] = False
    grad = torch.randn(3, 51, generator=g)
    if packed:
        tokens, start = _pack(h, [32, 0, 9])
        out, arg = training.splade_max_packed_argmax_triton(tokens, w, b, start)
    else:
        tokens = h.reshape(-1, 32)
        start = torch.arange(0, 4 * 32, 32, dtype=torch.int32)
        out, arg = training.splade_max_argmax_triton(h, w, b, mask)
    results = []
    for _ in range(2):
        grads = tuple(torch.full_like(t, float("nan")) for t in (tokens, w, b))
        got = training._backward(grad, out, arg, tokens, w, start, "log1p_relu", grads=grads)
        assert all(x is y for x, y in zip(got, grads)), "the given buffers must be the ones written"
        for name, t in zip(("dH", "dW", "db"), got):
            assert torch.isfinite(t).all(), f"{name}: unwritten elements (seed {seed})"
        results.append(got)
    assert all(torch.equal(x, y) for x, y in zip(*results)), f"seed {seed}"


@needs_interpreter
@pytest.mark.parametrize("block_t", [16, 32])
def test_documents_of_every_length_in_chunks_of_rows(block_t, seed):
    """Packed documents of 0-40 rows, dH in chunks of 16 or 32 rows of one document each: short documents of one
    chunk, long ones of several, empty ones of none (first, among others and last): the oracle's gradients, into
    poisoned buffers."""
    lengths = [0, 3, 0, 7, 1, 40, 1, 5, 2, 0, 33, 6, 4, 1, 17, 3, 2, 16, 5, 1, 1, 1, 6, 0]
    seq = max(lengths)
    h, w, b, g = _inputs(seed, len(lengths), seq, 32, 45, torch.float32)
    tokens, cu = _pack(h, lengths)
    grad = torch.randn(len(lengths), 45, generator=g)
    out, arg = training.splade_max_packed_argmax_triton(tokens, w, b, cu)
    buffers = tuple(torch.full_like(t, float("nan")) for t in (tokens, w, b))
    configs = (training.INTERPRETER_GRAD_WEIGHT, {**training.INTERPRETER_GRAD_HIDDEN, "BLOCK_T": block_t})
    got = training._backward(grad, out, arg, tokens, w, cu, "log1p_relu", grads=buffers, configs=configs)
    mask = _prefix_mask(lengths, seq)
    want = _oracle(h, w, b, mask, grad, choice=torch.where(arg >= 0, arg - cu[:-1].long()[:, None], -1).long())
    _check_grads(got, (want[2][mask], want[3], want[4]), torch.float32, seed, f"chunks of {block_t} rows")


@needs_interpreter
def test_rows_outside_every_document_get_zero_gradient(seed):
    """Packed rows before cu_seqlens[0] and after cu_seqlens[-1] (a buffer of fixed capacity) belong to no document:
    their dH is written, as zeros, into a poisoned buffer."""
    h, w, b, g = _inputs(seed, 1, 12, 16, 20, torch.float32)
    tokens = h[0]
    cu = torch.tensor([2, 5, 9], dtype=torch.int32)
    out, arg = training.splade_max_packed_argmax_triton(tokens[2:9], w, b, cu - 2)
    arg = torch.where(arg >= 0, arg + 2, -1)  # rows of the whole buffer
    grad = torch.randn(2, 20, generator=g)
    dh = training._backward(grad, out, arg, tokens, w, cu, "log1p_relu", True, False, False,
                            grads=(torch.full_like(tokens, float("nan")), None, None))[0]
    assert torch.isfinite(dh).all() and (dh[:2] == 0).all() and (dh[9:] == 0).all(), f"seed {seed}"
    inside = training._backward(grad, out, arg - 2, tokens[2:9], w, cu - 2, "log1p_relu", True, False, False)[0]
    assert torch.equal(dh[2:9], inside), f"seed {seed}"


@needs_interpreter
def test_offsets_past_two_to_the_31_elements(tmp_path, seed):
    """An upstream gradient viewed with a column stride of 2^28 + 1 (a transposed [B, V] gradient with B·V past 2^31
    elements): its addresses need 64-bit offsets. A sparse file holds the view's storage without using the memory."""
    batch, seq, hidden, vocab = 2, 4, 16, 17
    stride, offset = 2**28 + 1, 2**32  # v·stride passes 2^31 from v = 8; the offset keeps a wrapped address mapped
    size = offset + (vocab - 1) * stride + batch
    path = tmp_path / "grad.bin"
    with path.open("wb") as f:
        f.truncate(size * 4)
    grad = torch.from_file(str(path), shared=True, size=size, dtype=torch.float32).as_strided(
        (batch, vocab), (1, stride), offset)
    h, w, _, g = _inputs(seed, batch, seq, hidden, vocab, torch.float32)
    grad.copy_(torch.rand(batch, vocab, generator=g) + 0.5)
    b = torch.full((vocab,), 2.0)  # every term positive: every pair has a gradient
    mask = torch.ones(batch, seq, dtype=torch.bool)
    out, arg = training.splade_max_argmax_triton(h, w, b, mask)
    tokens, start = h.reshape(-1, hidden), torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32)
    got = training._backward(grad, out, arg, tokens, w, start, "log1p_relu")
    want = training._backward(grad.contiguous(), out, arg, tokens, w, start, "log1p_relu")
    for name, a, r in zip(("dH", "dW", "db"), got, want):
        assert torch.equal(a, r), f"{name} differs with the strided gradient (seed {seed})"


@needs_interpreter
def test_expanded_gradient_and_partial_requires_grad(seed):
    """out.sum() sends an expanded gradient (stride 0); only hidden requiring grad computes dH alone; a frozen
    hidden (a probe on a fixed body) computes dW and db alone."""
    h, w, b, _ = _inputs(seed, 2, 20, 32, 30, torch.float32)
    mask = torch.ones(2, 20, dtype=torch.bool)
    want = _oracle(h, w, b, mask, torch.ones(2, 30))
    hh = h.clone().requires_grad_()
    sparton.splade_max(hh, w, b, mask, backend="triton").sum().backward()
    assert _rel(hh.grad, want[2]) <= TOL[torch.float32], f"seed {seed}"
    ww, bb = w.clone().requires_grad_(), b.clone().requires_grad_()
    sparton.splade_max(h, ww, bb, mask, backend="triton").sum().backward()
    assert _rel(ww.grad, want[3]) <= TOL[torch.float32] and _rel(bb.grad, want[4]) <= TOL[torch.float32]


@needs_interpreter
def test_non_contiguous_inputs(seed):
    """Transposed views for hidden and weight (the gradients come back in their shapes, row-major inside)."""
    h, w, b, g = _inputs(seed, 2, 18, 32, 37, torch.float32)
    mask = torch.rand(2, 18, generator=g) < 0.8
    grad = torch.randn(2, 37, generator=g)
    ht = h.transpose(0, 1).contiguous().clone().requires_grad_()  # [L, B, H] storage, viewed back as [B, L, H]
    wt = w.T.contiguous().clone().requires_grad_()  # [H, V] storage
    out = sparton.splade_max(ht.transpose(0, 1), wt.T, b, mask, backend="triton")
    (out * grad).sum().backward()
    _, arg = training.splade_max_argmax_triton(h, w, b, mask)
    want = _oracle(h, w, b, mask, grad, choice=_positions(arg, 18))
    assert _rel(ht.grad.transpose(0, 1), want[2]) <= TOL[torch.float32], f"seed {seed}"
    assert _rel(wt.grad.T, want[3]) <= TOL[torch.float32], f"seed {seed}"


@needs_interpreter
def test_no_gradient_needed_runs_the_inference_kernel(monkeypatch, seed):
    """Under no_grad, or with no input requiring grad, the inference kernel runs and no argmax is written; with a
    gradient needed, the training kernel runs."""
    def boom(*args, **kwargs):
        raise AssertionError("the training forward ran without a gradient to compute")

    h, w, b, _ = _inputs(seed, 2, 10, 32, 20, torch.float32)
    mask = torch.ones(2, 10)
    monkeypatch.setattr(training, "_forward", boom)
    sparton.splade_max(h, w, b, mask, backend="triton")
    with torch.no_grad():
        sparton.splade_max(h, w.clone().requires_grad_(), b, mask, backend="triton")
        sparton.splade_max_packed(h[0], w.clone().requires_grad_(), b, torch.tensor([0, 4, 10]), backend="triton")
    with torch.inference_mode():
        sparton.splade_max(h, w, b, mask, backend="triton")
    monkeypatch.undo()
    out = sparton.splade_max(h, w.clone().requires_grad_(), b, mask, backend="triton")
    assert out.requires_grad and out.grad_fn is not None


@needs_interpreter
@pytest.mark.parametrize("packed", [False, True])
def test_the_backward_gets_no_gradient_for_the_argmax(packed, seed):
    """Autograd would hand the backward a materialized zero gradient for the int32 argmax output, a [B, V] tensor as
    large as the output: the op's backward receives None for it."""
    op = training.splade_max_packed_argmax_op if packed else training.splade_max_argmax_op
    setup, backward = (training._setup_packed, training._backward_packed) if packed else \
        (training._setup_padded, training._backward_padded)
    seen = []

    def spy(ctx, grad, grad_arg):
        seen.append((grad is None, grad_arg))
        return backward(ctx, grad, grad_arg)

    h, w, b, g = _inputs(seed, 2, 5, 32, 40, torch.float32)
    leaves = [t.clone().requires_grad_() for t in (h, w, b)]
    op.register_autograd(spy, setup_context=setup)
    try:
        if packed:
            tokens, cu = _pack(leaves[0], [5, 3])
            out, _ = torch.ops.sparton.splade_max_packed_argmax(tokens, leaves[1], leaves[2], cu, None, "log1p_relu")
        else:
            mask = torch.ones(2, 5, dtype=torch.bool)
            out, _ = torch.ops.sparton.splade_max_argmax(leaves[0], leaves[1], leaves[2], mask, "log1p_relu")
        (out * torch.rand(out.shape, generator=g)).sum().backward()
        assert seen == [(False, None)], seen
        assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in leaves), f"seed {seed}"
    finally:
        op.register_autograd(backward, setup_context=setup)


class _Cut(torch.autograd.Function):
    """Passes its input on and sends no gradient back (None): the head's backward then runs on an undefined gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


@needs_interpreter
def test_an_undefined_output_gradient_gives_no_gradients(seed):
    """A consumer of the head's output that sends back no gradient: the backward returns none (not zeros, not an
    error), and the inputs' gradients come from the rest of the loss alone."""
    h, w, b, _ = _inputs(seed, 2, 5, 32, 40, torch.float32)
    leaves = [t.clone().requires_grad_() for t in (h, w, b)]
    out, _ = torch.ops.sparton.splade_max_argmax(*leaves, torch.ones(2, 5, dtype=torch.bool), "log1p_relu")
    (_Cut.apply(out).sum() + leaves[0].sum()).backward()
    assert torch.equal(leaves[0].grad, torch.ones_like(h)), f"seed {seed}"
    assert leaves[1].grad is None and leaves[2].grad is None, f"seed {seed}"


@needs_interpreter
def test_custom_ops_registration(seed):
    """Schemas, fake kernels and autograd registration of the training ops (what torch.compile relies on)."""
    h, w, b, _ = _inputs(seed, 2, 5, 32, 40, torch.float32)
    mask = torch.ones(2, 5, dtype=torch.bool)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    w = w.requires_grad_()
    torch.library.opcheck(torch.ops.sparton.splade_max_argmax.default, (h, w, b, mask), test_utils=utils)
    tokens, cu = _pack(h, [5, 2])
    torch.library.opcheck(torch.ops.sparton.splade_max_packed_argmax.default, (tokens, w, None, cu, 5),
                          test_utils=utils)
    out, arg = training.splade_max_argmax_triton(h, w.detach(), b, mask)
    start = torch.tensor([0, 5, 10], dtype=torch.int32)
    args = (torch.randn(2, 40), out, arg, h.reshape(10, 32), w.detach(), start, "log1p_relu", True, True, True)
    torch.library.opcheck(torch.ops.sparton.splade_max_backward.default, args, test_utils=("test_schema",
                                                                                           "test_faketensor"))


# ---------------------------------------------------------------- the differentiable PyTorch reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_gradients_blocked(monkeypatch, dtype, seed):
    """Token and vocabulary blocks far smaller than T and V (both block loops and their edges), padded with holes
    and an all-padding row, then packed with empty documents."""
    monkeypatch.setattr(reference, "_BLOCK_TOKENS", 7)
    monkeypatch.setattr(reference, "_BLOCK_VOCAB", 13)
    h, w, b, g = _inputs(seed, 3, 17, 16, 61, dtype)
    mask = torch.rand(3, 17, generator=g) < 0.6
    mask[1] = False
    grad = torch.randn(3, 61, generator=g)
    out, grads = _run(lambda h, w, b: sparton.splade_max(h, w, b, mask, backend="torch"), h, w, b, grad)
    want = _oracle(h, w, b, mask, grad)
    assert out.dtype == torch.float32 and _rel(out, want[0]) <= 1e-5
    _check_grads(grads, want[2:], dtype, seed, "reference padded")
    lengths = [17, 0, 5]
    tokens, cu = _pack(h, lengths)
    _, grads = _run(lambda t, w, b: sparton.splade_max_packed(t, w, b, cu, backend="torch"), tokens, w, b, grad)
    pmask = _prefix_mask(lengths, 17)
    want = _oracle(h, w, b, pmask, grad)
    _check_grads(grads, (want[2][pmask], want[3], want[4]), dtype, seed, "reference packed")


def test_reference_ties_follow_the_rule(monkeypatch, seed):
    """Exact ties across the reference's token blocks: the first copy takes every gradient."""
    monkeypatch.setattr(reference, "_BLOCK_TOKENS", 8)
    seq = 30
    copies = {2: [4, 9, 25]}
    h, w, b, g = _tied(seed, torch.float32, seq, copies)
    mask = torch.ones(2, seq)
    grad = torch.randn(2, 40, generator=g)
    _, grads = _run(lambda h, w, b: sparton.splade_max(h, w, b, mask, backend="torch"), h, w, b, grad)
    want = _oracle(h, w, b, mask, grad)
    assert (grads[0][0, copies[2]] == 0).all(), f"seed {seed}"
    _check_grads(grads, want[2:], torch.float32, seed, "reference ties")
    _, arg = reference._segment_max_argmax(h.reshape(-1, 32), torch.arange(2).repeat_interleave(seq), 2, w, b,
                                           "log1p_relu")
    assert torch.equal(_positions(arg, seq), want[1])


@pytest.mark.parametrize("activation", sparton.ACTIVATIONS)
def test_reference_gradcheck_float64(monkeypatch, activation, seed):
    """torch.autograd.gradcheck on small float64 shapes, padded (with an all-padding row) and packed (with an empty
    document), bias and no bias. Logits are kept away from relu's kink and from ties, where the function is not
    differentiable. (The Triton path is not gradchecked: it computes in float32; it is held to the float64 oracle.)"""
    monkeypatch.setattr(reference, "_BLOCK_TOKENS", 4)
    monkeypatch.setattr(reference, "_BLOCK_VOCAB", 5)
    h, w, b, _ = _inputs(seed, 3, 6, 8, 11, torch.float64)
    b = b + 3.0  # all pooled logits positive: away from relu's kink
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1] = False
    mask[2, 4:] = False

    def padded(h, w, b):
        return sparton.splade_max(h, w, b, mask, backend="torch", activation=activation)

    assert torch.autograd.gradcheck(padded, (h.requires_grad_(), w.requires_grad_(), b.requires_grad_()))
    tokens, cu = _pack(h.detach(), [6, 0, 4])

    def packed(t, w):
        return sparton.splade_max_packed(t, w, None, cu, backend="torch", activation=activation)

    assert torch.autograd.gradcheck(packed, (tokens.requires_grad_(), w))


def test_reference_sum_pooling_gradcheck(monkeypatch, seed):
    """Sum pooling stays differentiable (plain autograd, each vocabulary chunk recomputed in the backward)."""
    monkeypatch.setattr(reference, "_BLOCK_VOCAB", 4)
    h, w, b, _ = _inputs(seed, 2, 5, 8, 9, torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])

    def fn(h, w, b):
        return sparton.splade_max(h, w, b + 2.0, mask, backend="torch", pooling="sum")

    assert torch.autograd.gradcheck(fn, (h.requires_grad_(), w.requires_grad_(), b.requires_grad_()))


def test_reference_without_grad_is_unchanged(seed):
    """Without a gradient the reference returns what it did before (float32 values, the int8 screen where it
    applies), and no graph."""
    h, w, b, _ = _inputs(seed, 2, 9, 16, 50, torch.float32)
    mask = torch.ones(2, 9)
    plain = sparton.splade_max(h, w, b, mask, backend="torch")
    assert plain.grad_fn is None and plain.dtype == torch.float32
    traced = sparton.splade_max(h, w.clone().requires_grad_(), b, mask, backend="torch")
    assert traced.grad_fn is not None
    assert torch.allclose(plain, traced.detach(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the training benchmark's code paths


def _bench_train():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_train", root / "benchmarks" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_train_cuts_device_time_into_phases():
    """The profiled step's kernels (start µs, end µs, name) are cut into phases at the marker kernels, one per mark:
    overlapping kernels count once, kernels before the first or after the last marker belong to no phase."""
    bench = _bench_train()
    spans = [(0, 5, "k"), (10, 11, "m"), (12, 20, "k"), (15, 25, "k"), (30, 31, "m"), (32, 40, "k"), (50, 51, "m"),
             (60, 70, "k")]
    busy, phases = bench.busy_by_phase(spans, "m", ["a", "b", "end"])
    assert phases == {"a": 13 / 1e3, "b": 8 / 1e3} and busy == 21 / 1e3
    busy, phases = bench.busy_by_phase(spans, "m", ["a", "end"])  # markers not one per mark: the total only
    assert phases == {} and busy == 36 / 1e3
    assert bench.busy_by_phase(spans, None, ["a"]) == (bench._union_ms([(s, e) for s, e, _ in spans]), {})
    coarse = bench.coarse({"head fwd q": {"gpu_ms": 1.0}, "body fwd d": {"gpu_ms": 2.0}, "head fwd d": {"gpu_ms": 3.0}})
    assert coarse == {"body fwd": {"gpu_ms": 2.0}, "head fwd": {"gpu_ms": 4.0}}


def test_bench_train_smoke_run_on_cpu(tmp_path):
    """benchmarks/bench_train.py end to end on CPU with tiny bodies (the reference head stands in for the kernel):
    every section runs, every step phase is marked, the loss curves of the heads agree, the results carry their
    provenance."""
    import json

    bench = _bench_train()
    args = ["--device", "cpu", "--quick", "--bodies", "bert-base", "--curve-steps", "3", "--steps", "1",
            "--batch-cap", "8", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "train_cpu.json").read_text())
    assert result["provenance"]["command"].startswith("python")
    sections = {row["section"] for row in result["rows"]}
    assert sections == {"step", "head", "batch"}, sections
    assert all(row["status"] == "ok" for row in result["rows"]), result["rows"]
    steps = [row for row in result["rows"] if row["section"] == "step"]
    assert {row["head"] for row in steps} == {"sparton", "eager"}
    for row in steps:  # every phase of the step was marked, the backward's through the tensor hooks
        assert list(row["coarse"]) == ["body fwd", "head fwd", "loss", "head bwd", "body bwd", "decoder",
                                       "optimizer"], row["coarse"]
        assert abs(sum(p["host_ms"] for p in row["phases"].values()) - row["host_ms"]) < 1e-6
        assert 0 < row["d_tokens"] < row["d_padded"]  # the Sparton head's packed rows: real tokens only
    summary = result["curves"]["summary"]
    for key in ("sparton_vs_eager", "eager32_vs_eager"):  # fp32 on CPU: the heads differ by rounding only
        assert summary[key]["max"] < 1e-3, summary
    assert (tmp_path / "train_cpu.csv").read_text().startswith("# provenance: ")
    assert b"provenance" in (tmp_path / "train_cpu.png").read_bytes()[:4096]


def test_bench_train_checkpointed_body_on_cpu(tmp_path):
    """--checkpoint-body: the step trains with the body's activations recomputed in the backward, and the results go
    to their own files, saying so."""
    import json

    bench = _bench_train()
    args = ["--device", "cpu", "--quick", "--bodies", "bert-base", "--sections", "step", "--heads", "sparton",
            "--steps", "1", "--checkpoint-body", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "train_cpu_checkpointed.json").read_text())
    assert result["meta"]["checkpoint_body"] is True and not (tmp_path / "train_cpu.json").exists()
    assert [row["status"] for row in result["rows"]] == ["ok"]
