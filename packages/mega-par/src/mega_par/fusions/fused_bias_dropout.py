"""``residual + dropout(x + bias)`` after attention and after the MLP (``megatron/core/fusions/fused_bias_dropout.py``).

``get_bias_dropout_add(training, fused)`` returns the function a ``TransformerLayer`` applies as
``bda(x_with_bias=(x, bias), residual, prob)``. ``fused=True`` selects Megatron's jit-fused kernel, which
computes the same thing; here both are the plain expression.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _bias_dropout_add(x_with_bias, residual: torch.Tensor, prob: float, training: bool) -> torch.Tensor:
    x, bias = x_with_bias
    if bias is not None:
        x = x + bias
    if training and prob > 0:
        x = F.dropout(x, p=prob, training=True)
    return residual + x


def bias_dropout_add_unfused(training: bool):
    def _bias_dropout_add_func(x_with_bias, residual, prob):
        return _bias_dropout_add(x_with_bias, residual, prob, training)

    return _bias_dropout_add_func


def get_bias_dropout_add(training: bool, fused: bool):
    """Megatron's selector; ``fused`` changes the kernel there, not the result, so it is accepted and equal."""
    return bias_dropout_add_unfused(training)
