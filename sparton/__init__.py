"""sparton: fused SPLADE pooling, activate(max over tokens of H·Wᵀ + bias), without [B, L, V] logits.

CUDA tensors run the Triton kernel (``splade_head``); CPU tensors run the chunked PyTorch reference, or the
Triton kernel under Triton's interpreter when TRITON_INTERPRET=1 and ``backend="triton"`` (for tests).

Both paths are differentiable in hidden, weight and bias. A call that needs no gradient (no input requires one, or
under torch.no_grad / inference_mode) runs the inference kernel, which writes no argmax. A call that needs one runs
``training``'s forward, which also records each (document, term)'s argmax token (int32 [B, V], the lowest row among
equal maxima), and its fused backward; the reference follows the same tie rule.

``activation`` is SPLADE's ``"log1p_relu"`` or ``"log1p_log1p_relu"`` (sentence-transformers'
``SpladePooling(activation_function="log1p_relu")``); both are monotone, so the kernel takes the max of the raw
logits and activates once. ``pooling="sum"`` (sum over tokens of the activated logits) is not a max: every token's
logit must be activated before it is added, and documents cut by a tile edge would be combined with float atomic
adds, whose order (so whose rounding) changes from run to run, and resumed encodings must be byte-identical. It
always runs the chunked PyTorch path, on any device (it is SPLADE v1's pooling; later SPLADE models use max).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .activations import ACTIVATIONS, POOLINGS, check_options
from .reference import splade_max_packed_reference, splade_max_reference

try:
    from . import splade_head, training
except ImportError:  # triton is an optional dependency (the "gpu" extra); the reference still works
    splade_head = training = None

__all__ = [
    "ACTIVATIONS",
    "POOLINGS",
    "prepare",
    "splade_max",
    "splade_max_packed",
    "splade_max_packed_reference",
    "splade_max_reference",
]

_BACKENDS = ("auto", "triton", "torch")


def _use_triton(hidden: Tensor, backend: str, pooling: str, activation: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"sparton: backend must be one of {_BACKENDS}, got {backend!r}")
    check_options(pooling, activation)
    if backend == "torch" or pooling == "sum":
        return False
    if backend == "auto":
        return hidden.is_cuda and splade_head is not None
    if splade_head is None:
        raise RuntimeError("sparton: backend='triton' needs the triton package")
    if not (hidden.is_cuda or (hidden.device.type == "cpu" and splade_head.interpreting())):
        raise ValueError(
            "sparton: backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1"
        )
    return True


# Inference calls the kernel's launcher directly: the first call through torch.ops (the custom operator, which
# torch.compile traces) imports torch's higher-order operators and, with them, dynamo and SymPy, seconds in a new
# process.


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def splade_max(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mask: Tensor,
    *,
    backend: str = "auto",
    pooling: str = "max",
    activation: str = "log1p_relu",
) -> Tensor:
    """w[b, v] = activation(max over kept s of hidden[b, s]·weight[v] + bias[v]); 0 for an all-padding row.

    hidden [B, L, H] (bf16 / fp16 / fp32), weight [V, H] of the same dtype, bias [V] or None,
    mask [B, L] (bool or int, nonzero = keep). Returns float32 [B, V], differentiable in hidden, weight and bias.
    """
    if _use_triton(hidden, backend, pooling, activation):
        if _needs_grad(hidden, weight, bias):
            return torch.ops.sparton.splade_max_argmax(hidden, weight, bias, mask, activation)[0]
        if torch.compiler.is_compiling():
            return torch.ops.sparton.splade_max(hidden, weight, bias, mask, activation)
        return splade_head.splade_max_triton(hidden, weight, bias, mask, activation=activation)
    return splade_max_reference(hidden, weight, bias, mask, pooling=pooling, activation=activation)


def splade_max_packed(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    max_seqlen: int | None = None,
    *,
    backend: str = "auto",
    pooling: str = "max",
    activation: str = "log1p_relu",
) -> Tensor:
    """As :func:`splade_max` for B documents packed back to back: hidden [T, H], cu_seqlens int32 [B+1]
    (cu_seqlens[0] = 0, cu_seqlens[-1] = T). A zero-length document gives a zero row. max_seqlen is a tuning
    hint only. Returns float32 [B, V], differentiable in hidden, weight and bias."""
    if _use_triton(hidden, backend, pooling, activation):
        if _needs_grad(hidden, weight, bias):
            return torch.ops.sparton.splade_max_packed_argmax(hidden, weight, bias, cu_seqlens, max_seqlen,
                                                              activation)[0]
        if torch.compiler.is_compiling():
            return torch.ops.sparton.splade_max_packed(hidden, weight, bias, cu_seqlens, max_seqlen, activation)
        return splade_head.splade_max_packed_triton(hidden, weight, bias, cu_seqlens, max_seqlen,
                                                    activation=activation)
    return splade_max_packed_reference(hidden, weight, bias, cu_seqlens, pooling=pooling, activation=activation)


def prepare() -> None:
    """The part of a process's first Triton launch that needs no GPU, done now: Triton keys its on-disk cache by a
    hash of its own sources and library (hundreds of MB, once per process), read here from a file kept by an earlier
    process for the same installation, else computed and kept (sparton/triton_key.py). Call it in a thread beside
    other start-up work: the hashing, when it runs, holds the GIL little."""
    if splade_head is not None:
        splade_head.prepare()
