"""The int8 screen of the CPU head (sparton.cpu_head): float32's result, never a term lost to int8 rounding.

Compared with a float64 oracle on fresh random inputs of odd sizes, with blocks far smaller than the inputs, and on
inputs built so that int8 rounding pushes a positive logit below zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparton
from sparton import activations, cpu_head, reference

pytestmark = pytest.mark.skipif(not hasattr(torch, "_int_mm"), reason="this torch has no int8 matmul")


@pytest.fixture(autouse=True)
def screen_on(monkeypatch):
    """The screen runs on any CPU (torch's int8 matmul has a plain fallback): forced on, so that these tests hold where
    `available()` says it would not pay. A test that wants the float32 path turns it off again."""
    monkeypatch.setattr(cpu_head, "available", lambda: True)


def _oracle(tokens, weight, bias, lengths, activation="log1p_relu"):
    """float64 max pooling of each document's rows, activated; 0 for an empty document."""
    logits = tokens.double() @ weight.double().T + (bias.double() if bias is not None else 0)
    rows = []
    for part in logits.split(lengths):
        top = part.amax(0) if part.shape[0] else torch.full((weight.shape[0],), float("-inf"), dtype=torch.float64)
        rows.append(activations.activate(top, activation))
    return torch.stack(rows)


def _packed(seed: int, lengths: list[int], hidden: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(sum(lengths), hidden, generator=g).to(dtype)
    weight = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(dtype)
    bias = torch.randn(vocab, generator=g) - 2.0  # most logits below zero, as in a trained SPLADE head
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return tokens, weight, bias, cu


@pytest.mark.parametrize("path", ["int8 screen", "float32"])
@pytest.mark.parametrize("activation", sparton.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_cpu_path_equals_the_float64_oracle(monkeypatch, seed, dtype, activation, path):
    monkeypatch.setattr(cpu_head, "available", lambda: path == "int8 screen")
    for module in (cpu_head, reference):  # documents across token blocks, ragged vocabulary blocks
        monkeypatch.setattr(module, "_BLOCK_TOKENS", 7)
        monkeypatch.setattr(module, "_BLOCK_VOCAB", 97)
    lengths = [5, 0, 13, 1, 9, 0]
    tokens, weight, bias, cu = _packed(seed, lengths, 24, 331, dtype)
    got = sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch", activation=activation)
    want = _oracle(tokens, weight, bias, lengths, activation)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5, msg=lambda m: f"seed {seed}: {m}")
    assert (got[want > 1e-5] > 0).all()  # no term lost
    assert (got[[1, 5]] == 0).all()


def _components_round_to_zero():
    """One component sets the scale (127 → step 1); the other 127, at 0.49, all round to 0: the int8 logit of a term
    that reads only them is 0, the float32 one 62.23. The bias puts the float32 logit at +0.23 and the int8 one at
    -62: a plain int8 screen would drop the term."""
    tokens = torch.full((2, 128), 0.49)
    tokens[:, 0] = 127.0
    weight = torch.zeros(64, 128)
    weight[0, 1:] = 1.0
    weight[1:, 0] = -1.0  # 63 terms far below zero
    return tokens, weight, torch.tensor([-62.0] + [-10.0] * 63), 0.49 * 127 - 62


def _weight_components_round_to_zero():
    """The same on the weight's side: a term row whose components but one round to 0 (float32 +0.23, int8 -62)."""
    tokens = torch.zeros(2, 128)
    tokens[:, 1:] = 1.0
    weight = torch.zeros(64, 128)
    weight[0, 0], weight[0, 1:] = 127.0, 0.49
    weight[1:, 1:] = -1.0
    return tokens, weight, torch.tensor([-62.0] + [-10.0] * 63), 0.49 * 127 - 62


def _small_token_beside_a_large_one():
    """A document's tokens share one scale: beside a token of 1,000 (step 7.9) every component of a token of 0.3 rounds
    to 0, yet only that token makes the term positive (float32 +0.1, int8 -38)."""
    tokens = torch.zeros(3, 128)
    tokens[0, 0] = 1000.0
    tokens[1:, 1:] = 0.3
    weight = torch.zeros(64, 128)
    weight[0, 1:] = 1.0
    weight[1:, 0] = -1.0
    return tokens, weight, torch.tensor([-38.0] + [-10.0] * 63), 0.3 * 127 - 38


@pytest.mark.parametrize("make", [_components_round_to_zero, _weight_components_round_to_zero,
                                  _small_token_beside_a_large_one],
                         ids=["token-round-to-zero", "weight-round-to-zero", "small-beside-large"])
def test_a_term_int8_puts_below_zero_and_float32_above_is_kept(make):
    tokens, weight, bias, logit = make()
    assert logit > 0
    got = cpu_head.screened_max_pool(tokens, torch.zeros(tokens.shape[0], dtype=torch.long), 1, weight, bias,
                                     "log1p_relu")
    assert got is not None  # the screen itself answered, not the dense fallback
    want = torch.zeros(64)
    want[0] = math.log1p(logit)
    torch.testing.assert_close(got[0], want, rtol=0, atol=2e-4)


def test_the_weight_is_quantized_again_after_it_changes(seed):
    """The int8 rows are kept per weight tensor: an in-place change must not leave them stale (here, term 0 turns from
    far below zero to positive)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.rand(6, 32, generator=g) + 0.5
    weight = -torch.rand(64, 32, generator=g) - 0.5
    doc_ids = torch.zeros(6, dtype=torch.long)
    bias = torch.zeros(64)
    assert (cpu_head.screened_max_pool(tokens, doc_ids, 1, weight, bias, "log1p_relu") == 0).all()
    weight[0].neg_()
    got = cpu_head.screened_max_pool(tokens, doc_ids, 1, weight, bias, "log1p_relu")
    assert got is not None and got[0, 0] > 0, f"seed {seed}"
    torch.testing.assert_close(got.double(), _oracle(tokens, weight, bias, [6]), rtol=2e-5, atol=2e-5)


def test_a_weight_made_under_inference_mode_is_screened(seed):
    """Inference tensors keep no version counter: such a weight is quantized at each call, not kept."""
    with torch.inference_mode():
        tokens, weight, bias, _ = _packed(seed, [5, 7], 16, 60, torch.float32)
    doc_ids = torch.repeat_interleave(torch.arange(2), torch.tensor([5, 7]))
    got = cpu_head.screened_max_pool(tokens, doc_ids, 2, weight, bias - 2, "log1p_relu")
    assert got is not None, f"seed {seed}: the dense fallback answered"
    torch.testing.assert_close(got.double(), _oracle(tokens, weight, bias - 2, [5, 7]), rtol=2e-5, atol=2e-5)


def _summed_in_float32(products: list[float], bias: float, fused: bool) -> float:
    """h·w + b as a float32 path may sum it: products rounded one by one, or each added with one rounding (FMA)."""
    total = np.float32(0)
    for p in products:
        total = np.float32(np.float64(total) + p) if fused else np.float32(total + np.float32(p))
    return float(np.float32(total + np.float32(bias)))


def test_a_term_only_float32_rounding_makes_positive_is_kept():
    """The exact logit is -0.0021; summed in float32 (products rounded, or fused multiply-adds) it is +0.0005 or
    within rounding of it, on any CPU: the inputs quantize to int8 exactly (no residual), so only the float32 rounding
    term of the bound keeps the pair. The screen then computes it as the float32 path does."""
    token = [192.8564453125, -174.6337890625]
    row = [-234.83837890625, -223.74365234375]
    bias0 = 6216.89111328125
    exact = sum(a * b for a, b in zip(token, row)) + bias0
    assert exact < 0
    some_order_positive = [_summed_in_float32([a * b for a, b in zip(token, row)], bias0, fused)
                           for fused in (False, True)]
    assert max(some_order_positive) > 0  # the case is one rounding can make positive
    tokens = torch.tensor([token])
    weight = torch.zeros(16, 2)
    weight[0] = torch.tensor(row)
    bias = torch.full((16,), -1.0)
    bias[0] = bias0
    keep = cpu_head.candidates(tokens, torch.zeros(1, dtype=torch.long), 1, weight, bias)
    assert keep is not None and keep[0, 0] and not keep[0, 1:].any()
    got = cpu_head.screened_max_pool(tokens, torch.zeros(1, dtype=torch.long), 1, weight, bias, "log1p_relu")
    float32 = activations.activate(torch.mm(tokens, weight[[0]].T) + bias[[0]], "log1p_relu")
    torch.testing.assert_close(got[0, :1], float32[0], rtol=0, atol=0)
    assert (got[0, 1:] == 0).all()


def test_logits_past_float32s_range_go_to_the_float32_path():
    """Products of 2^67 overflow float32's sums (inf - inf: NaN there): the bound does not model that, so the screen
    steps aside."""
    tokens = torch.tensor([[127.0, -127.0]]) * 2.0**60
    weight = torch.zeros(16, 2)
    weight[0] = torch.tensor([127.0, 127.0]) * 2.0**60
    bias = torch.full((16,), -1.0)
    assert cpu_head.screened_max_pool(tokens, torch.zeros(1, dtype=torch.long), 1, weight, bias, "log1p_relu") is None


def test_a_weight_given_new_data_is_quantized_again(seed):
    """`.data = other` (as loaders and weight tying do) keeps the object and its version: the storage tells."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.rand(6, 32, generator=g) + 0.5
    weight = -torch.rand(64, 32, generator=g) - 0.5
    doc_ids = torch.zeros(6, dtype=torch.long)
    assert (cpu_head.screened_max_pool(tokens, doc_ids, 1, weight, torch.zeros(64), "log1p_relu") == 0).all()
    flipped = weight.clone()
    flipped[0].neg_()
    weight.data = flipped
    got = cpu_head.screened_max_pool(tokens, doc_ids, 1, weight, torch.zeros(64), "log1p_relu")
    assert got is not None and got[0, 0] > 0, f"seed {seed}"


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
    lengths = [4, 6, 3] + [5] * 13
    tokens, weight, bias, cu = _packed(seed, lengths, 16, 90, torch.float32)
    bias -= 3  # few terms kept: the NaN document's 90 pairs alone stay under the screen's dense limit
    tokens[5, 3] = float("nan")  # document 1
    bias[[7, 40]] = float("-inf")  # rows no token maps to
    doc_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    screened = cpu_head.screened_max_pool(tokens, doc_ids, len(lengths), weight, bias, "log1p_relu")
    assert screened is not None, f"seed {seed}: the dense fallback answered"
    monkeypatch.setattr(cpu_head, "available", lambda: False)
    plain = sparton.splade_max_packed(tokens, weight, bias, cu, backend="torch")
    assert torch.equal(screened.isnan(), plain.isnan()) and screened[1].isnan().all()
    others = [d for d in range(len(lengths)) if d != 1]
    torch.testing.assert_close(screened[others], plain[others], rtol=1e-5, atol=1e-5)
    assert (screened[:, [7, 40]][others] == 0).all()


def _norm_underflow():
    """Token components ~1e-23 that round to 0 beside the one that sets the scale: their float32 squares flush to 0,
    so a float32 norm would drop the bound's error term, and the term that only they make positive with it."""
    hidden = 1024
    tokens = torch.full((4, hidden), 0.49 * 2.0**-76)
    tokens[:, 0] = 127 * 2.0**-76
    weight = torch.zeros(64, hidden)
    weight[:, 1:] = 2.0**56
    weight[1:, 0] = -(2.0**80)  # 63 terms far below zero
    logit = (hidden - 1) * 0.49 * 2.0**-20  # term 0, in float32; its int8 logit is 0
    bias = torch.full((64,), -1e6)
    bias[0] = -0.9 * logit
    return tokens, weight, bias


def _subnormal_inputs():
    """A subnormal token component: its scale is subnormal too."""
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
