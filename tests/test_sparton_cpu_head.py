"""The bf16 screen of the CPU head (sparton.cpu_head): float32's result, never a term lost to bf16 rounding.

Compared with a float64 oracle on fresh random inputs of odd sizes, with blocks far smaller than the inputs, and on
inputs built so that bf16 rounding pushes a positive logit below zero.
"""

from __future__ import annotations

import pytest
import torch

import sparton
from sparton import cpu_head, reference

pytestmark = pytest.mark.skipif(not cpu_head.available(),
                                reason="this CPU has no bf16 dot-product instructions: the float32 path runs")


def _oracle(tokens, weight, bias, lengths, activation="log1p_relu"):
    """float64 max pooling of each document's rows, activated; 0 for an empty document."""
    logits = tokens.double() @ weight.double().T + (bias.double() if bias is not None else 0)
    rows = []
    for part in logits.split(lengths):
        top = part.amax(0) if part.shape[0] else torch.full((weight.shape[0],), float("-inf"), dtype=torch.float64)
        rows.append(reference.activate(top, activation))
    return torch.stack(rows)


def _packed(seed: int, lengths: list[int], hidden: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(sum(lengths), hidden, generator=g).to(dtype)
    weight = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(dtype)
    bias = torch.randn(vocab, generator=g) - 2.0  # most logits below zero, as in a trained SPLADE head
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return tokens, weight, bias, cu


@pytest.mark.parametrize("activation", sparton.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_screen_equals_the_float64_oracle(monkeypatch, seed, dtype, activation):
    monkeypatch.setattr(cpu_head, "_BLOCK_TOKENS", 7)  # documents across token blocks, ragged vocabulary blocks
    monkeypatch.setattr(cpu_head, "_BLOCK_VOCAB", 97)
    lengths = [5, 0, 13, 1, 9, 0]
    tokens, weight, bias, cu = _packed(seed, lengths, 24, 331, dtype)
    got = sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch", activation=activation)
    want = _oracle(tokens, weight, bias, lengths, activation)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5, msg=lambda m: f"seed {seed}: {m}")
    assert (got[want > 1e-5] > 0).all()  # no term lost
    assert (got[[1, 5]] == 0).all()


def test_a_term_bf16_puts_below_zero_and_float32_above_is_kept():
    """Components 1 + 2^-9 - 2^-20 round down to 1 in bf16: over 128 of them the bf16 logit falls 0.5 short.
    The bias puts the float32 logit at +0.15 and the bf16 one at -0.35: a plain bf16 screen would drop the term."""
    hidden = 128
    x = 1 + 2.0**-9 - 2.0**-20
    tokens = torch.full((3, hidden), x)
    weight = torch.full((4, hidden), x)
    weight[1:] *= -1  # three terms far below zero
    exact = hidden * x * x
    bias = torch.tensor([-(exact - 0.15), 0.0, 0.0, 0.0])
    assert float(tokens.bfloat16()[0].float() @ weight.bfloat16()[0].float()) + float(bias[0]) < -0.3
    got = sparton.splade_max_packed(tokens, weight, bias, torch.tensor([0, 3], dtype=torch.int32), backend="torch")
    torch.testing.assert_close(got[0], torch.log1p(torch.tensor([0.15, 0, 0, 0])), rtol=0, atol=2e-4)


def test_the_cpu_head_runs_the_screen(monkeypatch, seed):
    calls = []
    screen = cpu_head.screened_max_pool
    monkeypatch.setattr(cpu_head, "screened_max_pool", lambda *a: calls.append(a) or screen(*a))
    tokens, weight, bias, cu = _packed(seed, [3, 4], 16, 50, torch.float32)
    sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch")
    sparton.splade_max(tokens.reshape(1, 7, 16), weight, bias, torch.ones(1, 7))
    sparton.splade_max_packed(tokens.double(), weight.double(), bias.double(), cu)  # float64: the plain oracle
    sparton.splade_max_packed(tokens, weight, bias, cu, pooling="sum")  # not a max: every token activated
    assert len(calls) == 2


def test_nan_and_masked_terms_come_out_as_in_the_float32_path(monkeypatch, seed):
    tokens, weight, bias, cu = _packed(seed, [4, 6, 3], 16, 90, torch.float32)
    tokens[5, 3] = float("nan")  # document 1
    bias[[7, 40]] = float("-inf")  # rows no token maps to
    screened = sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch")
    monkeypatch.setattr(cpu_head, "available", lambda: False)
    plain = sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch")
    assert torch.equal(screened.isnan(), plain.isnan()) and screened[1].isnan().all()
    torch.testing.assert_close(screened[[0, 2]], plain[[0, 2]], rtol=1e-5, atol=1e-5)
    assert (screened[:, [7, 40]][[0, 2]] == 0).all()


def _norm_underflow():
    """Token components ~1e-23: their float32 squares flush to 0, and a float32 norm would drop the bound's error term
    while each component rounds down to bf16 by almost a whole step."""
    hidden, bump = 1024, 1 + 0.99 * 2.0**-8
    tokens = torch.full((4, hidden), 2.0**-76 * bump)
    weight = torch.full((64, hidden), 2.0**56 * bump)
    screened = hidden * 2.0**-76 * 2.0**56  # what the bf16 logits see
    bias = torch.full((64,), -1e6)
    bias[0] = -screened * (1 + 2.0**-8 / (1 - 2.0**-8)) * (1 + 2.0**-20)  # just past the bf16 logit's own lift
    return tokens, weight, bias


def _subnormal_inputs():
    """A subnormal token component: the dot-product instructions read it as 0."""
    tokens = torch.zeros(2, 64)
    tokens[:, 0] = 1e-38
    weight = torch.zeros(64, 64)
    weight[:, 0] = 1e19
    bias = torch.full((64,), -1e6)
    bias[0] = -1e-25
    return tokens, weight, bias


@pytest.mark.parametrize("make", [_norm_underflow, _subnormal_inputs], ids=["norm-underflow", "subnormal"])
def test_extreme_scales_lose_no_term(monkeypatch, make):
    tokens, weight, bias = make()
    doc_ids = torch.zeros(tokens.shape[0], dtype=torch.long)
    screened = cpu_head.screened_max_pool(tokens, doc_ids, 1, weight, bias, "log1p_relu")
    assert screened is not None  # the screen itself answered, not the dense fallback
    monkeypatch.setattr(cpu_head, "available", lambda: False)
    plain = sparton.splade_max_packed(tokens, weight, bias, torch.tensor([0, tokens.shape[0]], dtype=torch.int32))
    assert plain[0, 0] > 0 and (plain[0, 1:] == 0).all()
    # the kept logit is a float32 sum of ~0.016 cancelled by the bias down to ~4e-6: each path rounds it its own way
    torch.testing.assert_close(screened, plain, rtol=0, atol=1e-9)


def test_a_head_with_most_terms_positive_runs_the_float32_path(seed):
    """An untrained head (bias 0: about half the terms positive) would make the screen recompute nearly everything."""
    tokens, weight, _, cu = _packed(seed, [6, 0, 9], 16, 200, torch.float32)
    lengths = [6, 0, 9]
    doc_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    assert cpu_head.screened_max_pool(tokens, doc_ids, 3, weight, torch.zeros(200), "log1p_relu") is None
    got = sparton.splade_max_packed(tokens, weight, torch.zeros(200), cu, backend="torch")
    torch.testing.assert_close(got.double(), _oracle(tokens, weight, torch.zeros(200), lengths), rtol=2e-5, atol=2e-5)
