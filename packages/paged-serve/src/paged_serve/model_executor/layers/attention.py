"""The paged ``Attention`` layer (vLLM ``vllm/attention/layer.py`` + its backend): write new K/V, attend over the cache.

One forward pass carries every scheduled token of every sequence, packed without padding: prefill tokens (whole
prompts or chunks) first, then one token per decoding sequence (``AttentionMetadata``). The layer scatters the
step's K/V into the cache slots, runs the prefill kernel over the prefill part and the decode kernel over the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from paged_serve.ops import paged_attn


@dataclass
class AttentionMetadata:
    """Where this step's tokens go and what each sequence attends to (vLLM ``FlashAttentionMetadata``).

    ``slot_mapping[t]``: the cache slot of token ``t``. Prefill part: ``query_start_loc`` (cu_seqlens of the new
    tokens), ``prefill_context_lens`` (tokens in the cache after this step's writes) and block tables. Decode part:
    one token per sequence with its context length and block table.
    """

    num_prefill_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    prefill_block_tables: torch.Tensor | None = None
    query_start_loc: torch.Tensor | None = None
    prefill_context_lens: torch.Tensor | None = None
    max_query_len: int = 0
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None


class Attention(nn.Module):
    """Multi-head / grouped-query attention over a paged KV cache for one layer."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """``query`` ``[tokens, heads * head_size]``, ``key``/``value`` ``[tokens, kv_heads * head_size]``."""
        num_tokens = query.shape[0]
        q = query.view(num_tokens, self.num_heads, self.head_size)
        k = key.view(num_tokens, self.num_kv_heads, self.head_size)
        v = value.view(num_tokens, self.num_kv_heads, self.head_size)
        key_cache, value_cache = kv_cache
        paged_attn.reshape_and_cache(k, v, key_cache, value_cache, attn_metadata.slot_mapping)
        out = torch.empty_like(q)
        num_prefill = attn_metadata.num_prefill_tokens
        if num_prefill:
            paged_attn.paged_prefill_attention(
                q[:num_prefill],
                key_cache,
                value_cache,
                attn_metadata.prefill_block_tables,
                attn_metadata.query_start_loc,
                attn_metadata.prefill_context_lens,
                self.scale,
                out=out[:num_prefill],
                key=k[:num_prefill],
                value=v[:num_prefill],
            )
        if attn_metadata.num_decode_tokens:
            paged_attn.paged_attention(
                q[num_prefill:],
                key_cache,
                value_cache,
                attn_metadata.decode_block_tables,
                attn_metadata.decode_context_lens,
                self.scale,
                out=out[num_prefill:],
            )
        return out.view(num_tokens, self.num_heads * self.head_size)
