"""GradientCheckpointingLayer: a decoder block that recomputes its activations in backward (transformers'
``modeling_layers``; Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost")."""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class GradientCheckpointingLayer(nn.Module):
    """``PreTrainedModel.gradient_checkpointing_enable`` sets ``gradient_checkpointing`` and the checkpoint function.

    Only training with gradients checkpoints: an eval or no-grad forward (generation) runs the block as is. Tensors
    that need gradients must be positional (reentrant checkpointing only tracks those); keywords are bound first.
    """

    gradient_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)


def use_cache_under_checkpointing(layers, use_cache: bool, training: bool) -> bool:
    """A checkpointed block is replayed in backward and would append to the cache twice: training with
    checkpointing runs without a cache, with transformers' warning (once)."""
    if use_cache and training and torch.is_grad_enabled() and any(layer.gradient_checkpointing for layer in layers):
        _warn_once("`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.")
        return False
    return use_cache


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)
