"""On CUDA the encoder runs the Sparton kernel; its vectors must match the CPU path's (run: pytest -m gpu)."""

from __future__ import annotations

import pytest
import torch

from lsr_index.encoder import SpladeEncoder
from lsr_index.models import load_model
from lsr_index.quantize import Quantization, quantize

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TEXTS = [f"protein {i} binds the receptor in cells " * (1 + i % 40) for i in range(300)] + ["x", "CRISPR"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_encoder_matches_cpu_encoder(dtype):
    cpu = SpladeEncoder(load_model("splade-tiny", device="cpu"), max_tokens=8192).encode(TEXTS, 256)
    gpu = SpladeEncoder(load_model("splade-tiny", device="cuda", dtype=dtype), max_tokens=8192,
                        backend="triton").encode(TEXTS, 256).cpu()
    rel = ((gpu - cpu).norm() / cpu.norm()).item()
    assert rel < (3e-3 if dtype == torch.float32 else 3e-2), rel
    a, b = quantize(cpu, Quantization()), quantize(gpu, Quantization())
    # nonzero terms may differ only where a weight sits at the rounding boundary (w·100 ≈ k + 0.5)
    agree = sum(len(set(a.row(i)[0]) & set(b.row(i)[0])) for i in range(len(TEXTS)))
    assert agree / max(a.nnz, b.nnz) > (0.995 if dtype == torch.float32 else 0.95)


def test_stream_of_items_matches_each_item_alone_on_cuda():
    from test_encoder import _stream_vs_items

    _stream_vs_items(SpladeEncoder(load_model("splade-tiny", device="cuda"), max_tokens=512), seed=7)


def test_staged_copies_arrive_whole_while_their_buffers_are_reused():
    """Batch inputs go to the GPU through two page-locked buffers used in turn: every array must arrive exactly,
    whatever its dtype, shape or size (buffers grow), although the buffer it went through is refilled later."""
    import numpy as np

    from lsr_index.encoder import _Staging

    rng = np.random.default_rng(11)
    staging, device, sent, got = _Staging(), torch.device("cuda"), [], []
    for _ in range(40):
        rows, cols = int(rng.integers(0, 300)), int(rng.integers(0, 2000))
        arrays = [rng.integers(-2**40, 2**40, (rows, cols)), rng.random((rows, cols)) < 0.5,
                  rng.integers(0, 2**31 - 1, int(rng.integers(0, 5000))).astype(np.int32)]
        sent.append(arrays)
        got.append(staging.upload(arrays, device))
    torch.cuda.synchronize()
    for arrays, tensors in zip(sent, got):
        for a, t in zip(arrays, tensors):
            assert t.device.type == "cuda" and t.shape == a.shape and np.array_equal(t.cpu().numpy(), a)
