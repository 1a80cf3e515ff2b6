"""Placeholders a spec leaves in a slot it does not fill (``megatron/core/transformer/identity_op.py``)."""

from __future__ import annotations

from torch import nn


class IdentityOp(nn.Module):
    """``IdentityOp(...)(x) -> x``: accepts and ignores any constructor and call arguments."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x, *args, **kwargs):
        return x


class IdentityFuncOp(IdentityOp):
    """``IdentityFuncOp(...)(...)`` returns a function that returns its first argument, the shape of
    ``get_bias_dropout_add(training, fused)`` which itself returns the function to apply."""

    def forward(self, *args, **kwargs):
        return lambda x, *a, **k: x
