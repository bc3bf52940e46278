"""What a token's logit becomes before pooling, and how tokens pool: the options every head path shares."""

from __future__ import annotations

import torch
from torch import Tensor

# What a token's logit x becomes before pooling. SPLADE's is log1p(relu(x)); the opensearch v3 models (through
# sentence-transformers' SpladePooling(activation_function="log1p_relu")) apply log1p once more.
ACTIVATIONS = ("log1p_relu", "log1p_log1p_relu")
POOLINGS = ("max", "sum")


def activate(x: Tensor, activation: str) -> Tensor:
    y = torch.log1p(torch.relu(x))
    return torch.log1p(y) if activation == "log1p_log1p_relu" else y


def check_options(pooling: str, activation: str) -> None:
    if pooling not in POOLINGS or activation not in ACTIVATIONS:
        raise ValueError(f"sparton: pooling must be one of {POOLINGS} and activation one of {ACTIVATIONS}, "
                         f"got {pooling!r}, {activation!r}")
