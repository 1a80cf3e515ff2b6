"""The RoPE scalings checkpoints ask for beyond the default (vLLM ``rotary_embedding.py``'s
``LinearScalingRotaryEmbedding`` and ``Llama3RotaryEmbedding``; transformers ``modeling_rope_utils.py``), registered
into the core's ``ROPE_SCALINGS`` by ``rope_type``: each maps the default inverse frequencies to the scaled ones."""

from __future__ import annotations

import math

import torch

from paged_serve.model_executor.layers.rotary_embedding import ROPE_SCALINGS


def linear_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Position interpolation (Chen et al., arXiv:2306.15595): every position divided by ``factor``."""
    return inv_freq / params["factor"]


def llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1's wavelength-dependent scaling: long wavelengths divided by ``factor``, short ones kept, a smooth
    blend between ``low_freq_factor`` and ``high_freq_factor``."""
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


ROPE_SCALINGS.update(linear=linear_inv_freq, llama3=llama3_inv_freq)
