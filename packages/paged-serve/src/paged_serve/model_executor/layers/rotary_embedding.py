"""Rotary position embedding (RoFormer, arXiv:2104.09864) with Llama's scalings (vLLM ``rotary_embedding.py``).

The cos/sin table is computed once for every position up to ``max_position`` in fp32, with the same arithmetic as
transformers' ``LlamaRotaryEmbedding`` (inverse frequencies times the position, then cos/sin), and cast to the
activations' dtype when applied, so positions far out keep fp32 accuracy in bf16 models. Scalings of the inverse
frequencies are looked up by ``rope_type`` in ``ROPE_SCALINGS`` (``default`` here; ``linear`` and ``llama3`` are
registered from ``_compat/model_executor/rope_scalings.py``).
"""

from __future__ import annotations

import torch
from torch import nn


def _inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


# rope_type -> f(inverse frequencies, rope_parameters): the scalings checkpoints ask for register here
# (``linear``, ``llama3``: ``_compat/model_executor/rope_scalings.py``)
ROPE_SCALINGS = {"default": lambda inv_freq, params: inv_freq}


def rope_inv_freq(head_dim: int, rope_parameters: dict) -> torch.Tensor:
    """Inverse frequencies for a transformers ``rope_parameters`` dict (``rope_type``, ``rope_theta``, ...)."""
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {tuple(ROPE_SCALINGS)}")
    inv_freq = _inv_freq(head_dim, float(rope_parameters.get("rope_theta", 10000.0)))
    return ROPE_SCALINGS[rope_type](inv_freq, rope_parameters)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to packed ``[tokens, heads * head_dim]`` queries and keys at their ``positions``."""

    def __init__(self, head_dim: int, max_position: int, rope_parameters: dict):
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.rope_parameters = dict(rope_parameters)
        self.build_cache()

    def build_cache(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the fp32 cos/sin table, e.g. after the model was materialised from the meta device."""
        inv_freq = rope_inv_freq(self.head_dim, self.rope_parameters)
        freqs = torch.arange(self.max_position, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # fp32 buffers, kept fp32 when the module is cast (see ``_apply``)
        self.register_buffer("cos_cache", emb.cos().to(device), persistent=False)
        self.register_buffer("sin_cache", emb.sin().to(device), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.cos_cache.dtype != torch.float32 and not self.cos_cache.is_meta:
            self.build_cache(self.cos_cache.device)  # a dtype cast must not round the table: recompute it in fp32
        return self

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin rows for ``positions``; one module serves every layer, so the last lookup is reused."""
        last = getattr(self, "_last", None)
        if last is None or last[0] is not positions or last[1] != dtype:
            cos = self.cos_cache[positions].to(dtype)[:, None, :]
            sin = self.sin_cache[positions].to(dtype)[:, None, :]
            self._last = last = (positions, dtype, cos, sin)
        return last[2], last[3]

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        cos, sin = self._cos_sin(positions, query.dtype)
        q = query.view(query.shape[0], -1, self.head_dim)
        k = key.view(key.shape[0], -1, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q.reshape(query.shape), k.reshape(key.shape)
