"""Core attention ``softmax(q k^T / sqrt(d) masked) v`` on this rank's heads
(``megatron/core/transformer/dot_product_attention.py``, its unfused path).

The mask follows Megatron's ``attention_mask_func``: boolean, ``True`` = masked out, broadcast to
``[b, heads, sq, sk]``, masked scores set to -10000 before a float32 softmax. Without a mask the module's
``attn_mask_type`` decides: ``causal`` builds the lower-triangular mask, the others mask nothing. The
probabilities' dropout draws from the per-TP-rank RNG state (heads are split over TP ranks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mega_par.tensor_parallel.random import get_cuda_rng_tracker
from mega_par.transformer.enums import AttnMaskType
from mega_par.transformer.module import MegatronModule


def get_default_causal_mask(sq: int, sk: int | None = None, device=None) -> torch.Tensor:
    """``[sq, sk]`` boolean, True above the diagonal (the future is masked out)."""
    sk = sq if sk is None else sk
    return torch.triu(torch.ones(sq, sk, dtype=torch.bool, device=device), diagonal=1)


def attention_mask_func(attention_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return attention_scores.masked_fill(attention_mask, -10000.0)


class DotProductAttention(MegatronModule):
    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if not isinstance(attn_mask_type, AttnMaskType):
            raise TypeError(f"attn_mask_type must be an AttnMaskType, got {attn_mask_type!r}")
        self.layer_number, self.attn_mask_type = layer_number, attn_mask_type
        self.attention_type = attention_type
        if softmax_scale is None:
            softmax_scale = getattr(config, "softmax_scale", None)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.attention_dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` (GQA groups repeated to ``np``)
        -> context ``[sq, b, np * hn]``."""
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("DotProductAttention: attention_bias and packed_seq_params are not supported")
        sq, b, np_, hn = query.shape
        sk = key.shape[0]
        if np_ != key.shape[2]:
            rep = np_ // key.shape[2]
            key, value = key.repeat_interleave(rep, dim=2), value.repeat_interleave(rep, dim=2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, np, s, hn]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale
        mask_type = attn_mask_type or self.attn_mask_type
        if attention_mask is None and mask_type == AttnMaskType.causal and sq > 1:
            attention_mask = get_default_causal_mask(sq, sk, device=scores.device)
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool:
                raise TypeError(f"attention_mask must be boolean (True = masked out), got {attention_mask.dtype}")
            try:
                scores = attention_mask_func(scores, attention_mask)
            except RuntimeError as e:
                raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not broadcast to "
                                 f"the scores [b, heads, sq, sk] = {tuple(scores.shape)}") from e
        probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
        if self.training and self.attention_dropout_p > 0:
            with get_cuda_rng_tracker().fork():
                probs = F.dropout(probs, p=self.attention_dropout_p, training=True)
        context = torch.matmul(probs, v)  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)
