"""Causal + padding attention masks for ``scaled_dot_product_attention`` (transformers' ``create_causal_mask``).

Boolean (True = may attend), as transformers' SDPA path builds them: torch's SDPA returns zeros for a fully masked
row (a left-pad query), so pad positions produce the same hidden states as in transformers.
"""

from __future__ import annotations

import torch


def create_causal_mask(attention_mask: torch.Tensor | None, query_length: int, past_length: int, dtype: torch.dtype,
                       device) -> torch.Tensor | None:
    """Return a ``(batch|1, 1, query_length, past_length + query_length)`` bool mask, or None when none is needed.

    ``attention_mask`` is the usual 2D 0/1 mask over *all* positions (past and current).
    """
    kv_length = past_length + query_length
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask
    if attention_mask is not None and attention_mask.shape[-1] != kv_length:
        raise ValueError(f"attention_mask has length {attention_mask.shape[-1]}, expected past ({past_length}) + new "
                         f"({query_length}) = {kv_length}")
    padding_free = attention_mask is None or bool(attention_mask.all())
    if padding_free and (query_length == 1 or past_length == 0):
        # SDPA's is_causal (top-left aligned) is exact when there is no past; one query sees everything.
        return None
    q_pos = torch.arange(query_length, device=device)[:, None] + past_length
    k_pos = torch.arange(kv_length, device=device)[None, :]
    allowed = (k_pos <= q_pos)[None, None]
    if not padding_free:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    return allowed
