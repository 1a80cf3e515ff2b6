"""Scaled dot-product attention as the models run it (transformers' ``sdpa_attention_forward`` and
``eager_attention_forward``): SDPA with the boolean mask, or the explicit softmax when the caller asks for the
attention weights (``output_attentions=True``), which SDPA does not return."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float, dropout: float = 0.0,
                      output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(batch, heads, q, d)`` queries over ``(batch, kv_heads, k, d)`` keys/values; kv heads are shared by query
    groups (GQA). ``attention_mask`` is a bool ``(batch|1, 1, q, k)`` mask, or None for plain causal attention."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    groups = query.shape[1] // key.shape[1]
    if not output_attentions:
        if attention_mask is not None and q_len > 1 and groups > 1:
            # Masked prefill copies the K/V heads as transformers does: their gradients are then summed over each
            # query group in the compute dtype, which bf16 training has to reproduce (SDPA's GQA sums in fp32).
            key, value, groups = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1), 1
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             is_causal=attention_mask is None and q_len > 1, scale=scaling,
                                             enable_gqa=groups > 1)
        return out, None
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is None:  # causal, aligned bottom-right as SDPA's is_causal is for q_len == kv_len
        q_pos = torch.arange(q_len, device=query.device)[:, None] + (kv_len - q_len)
        attention_mask = torch.arange(kv_len, device=query.device)[None, :] <= q_pos
    # The dtype's minimum, not -inf, as transformers' eager path: a fully masked (left-pad) row stays finite.
    weights = weights.masked_fill(~attention_mask, torch.finfo(weights.dtype).min)
    weights = F.dropout(torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype), p=dropout)
    return torch.matmul(weights, value), weights
