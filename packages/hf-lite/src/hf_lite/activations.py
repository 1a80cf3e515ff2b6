"""Activation functions by their transformers config names (``ACT2FN``)."""

from __future__ import annotations

import math

import torch
from torch import nn


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACT2FN = {"gelu_new": gelu_new, "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
          "gelu": nn.functional.gelu, "relu": nn.functional.relu, "silu": nn.functional.silu,
          "swish": nn.functional.silu}


def get_activation(name: str):
    if name not in ACT2FN:
        raise ValueError(f"activation {name!r} is not one of {sorted(ACT2FN)}")
    return ACT2FN[name]
