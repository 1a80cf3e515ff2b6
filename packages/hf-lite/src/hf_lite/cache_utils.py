"""DynamicCache: the per-layer key/value cache that lets generation feed one new token per step.

Same contract as transformers' ``DynamicCache``: ``update(key, value, layer_idx)`` appends along the sequence axis and
returns the full keys/values; ``get_seq_length()``; ``reorder_cache(beam_idx)`` for beam search; ``crop``.
"""

from __future__ import annotations

import torch


class DynamicCache:
    """Grows with every step; tensors are ``(batch, num_kv_heads, seq, head_dim)``."""

    def __init__(self, *args, **kwargs):
        # transformers' signature accepts (config=...) etc.; the cache needs nothing from them.
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.key_cache)

    def __getitem__(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs=None):
        if layer_idx > len(self.key_cache):
            raise ValueError(f"layer {layer_idx} updated before layer {len(self.key_cache)}")
        if layer_idx == len(self.key_cache):
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.key_cache[layer_idx].shape[-2] if layer_idx < len(self.key_cache) else 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row ``i`` of the new cache is row ``beam_idx[i]`` of the old one."""
        self.key_cache = [k.index_select(0, beam_idx.to(k.device)) for k in self.key_cache]
        self.value_cache = [v.index_select(0, beam_idx.to(v.device)) for v in self.value_cache]

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        self.key_cache = [k[..., :max_length, :] for k in self.key_cache]
        self.value_cache = [v[..., :max_length, :] for v in self.value_cache]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.key_cache = [k.repeat_interleave(repeats, dim=0) for k in self.key_cache]
        self.value_cache = [v.repeat_interleave(repeats, dim=0) for v in self.value_cache]

    def to_legacy_cache(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        return tuple(zip(self.key_cache, self.value_cache))

    @classmethod
    def from_legacy_cache(cls, past_key_values) -> DynamicCache:
        cache = cls()
        for layer_idx, (k, v) in enumerate(past_key_values or ()):
            cache.update(k, v, layer_idx)
        return cache


def prepare_past_key_values(past_key_values, cache, use_cache: bool):
    """A model's cache argument, normalised: ``cache`` is an alias, legacy tuples become a DynamicCache,
    and a fresh one is made when ``use_cache`` asks for caching without one."""
    past_key_values = cache if past_key_values is None else past_key_values
    if isinstance(past_key_values, (tuple, list)):
        past_key_values = DynamicCache.from_legacy_cache(past_key_values)
    if use_cache and past_key_values is None:
        past_key_values = DynamicCache()
    return past_key_values
