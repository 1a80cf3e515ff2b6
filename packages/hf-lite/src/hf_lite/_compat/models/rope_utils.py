"""The scaled RoPE variants long-context Llama checkpoints ship with (transformers' ``modeling_rope_utils.py``),
registered with the core rotary embedding: each rescales the default inverse frequencies."""

from __future__ import annotations

import math

import torch

from ...models.llama.configuration_llama import ROPE_REQUIRED
from ...models.llama.modeling_llama import ROPE_SCALING_FUNCTIONS


def linear_scaling(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Position interpolation (Chen et al. 2023): every frequency slowed by ``factor``."""
    return inv_freq / params["factor"]


def llama3_scaling(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by ``factor``, short ones kept, a smooth ramp between."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


ROPE_SCALING_FUNCTIONS.update(linear=linear_scaling, llama3=llama3_scaling)
ROPE_REQUIRED.update(linear=("factor",),
                     llama3=("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
