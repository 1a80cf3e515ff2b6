"""Self-attention split by heads over TP ranks (Megatron-LM arXiv 1909.08053 §3, Fig. 3b).

``linear_qkv`` is column-parallel (each rank owns whole query groups), ``linear_proj`` row-parallel, so
the block costs one ``f`` and one ``g``. The fused QKV weight uses Megatron's grouped layout
``[group0: q heads, k, v | group1: ...]`` so a contiguous column slice is a set of complete groups.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from mega_par.tensor_parallel.random import get_cuda_rng_tracker


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer), rotate-half convention as in Llama."""

    def __init__(self, kv_channels: int, rotary_base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, kv_channels, 2, dtype=torch.float32) / kv_channels))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, seq_len: int) -> torch.Tensor:
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=self.inv_freq.device), self.inv_freq)
        return torch.cat([freqs, freqs], dim=-1)  # [s, d]


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """t: [s, b, heads, d]; freqs: [s, d]."""
    cos, sin = freqs.cos()[:, None, None, :].to(t.dtype), freqs.sin()[:, None, None, :].to(t.dtype)
    x1, x2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-x2, x1], dim=-1) * sin


class SelfAttention(nn.Module):
    def __init__(self, config, layer_number: int):
        super().__init__()
        tp = ps.get_tensor_model_parallel_world_size()
        self.config, self.layer_number = config, layer_number
        if config.num_query_groups % tp:
            raise ValueError(f"num_query_groups ({config.num_query_groups}) must be divisible by the "
                             f"tensor-parallel size ({tp})")
        self.hd = config.kv_channels
        self.groups_per_partition = config.num_query_groups // tp
        self.heads_per_group = config.num_attention_heads // config.num_query_groups
        qkv_size = (config.num_attention_heads + 2 * config.num_query_groups) * self.hd
        self.linear_qkv = ColumnParallelLinear(config.hidden_size, qkv_size, config=config,
                                               init_method=config.init_method,
                                               bias=config.add_bias_linear or config.add_qkv_bias,
                                               gather_output=False)
        self.linear_proj = RowParallelLinear(config.num_attention_heads * self.hd, config.hidden_size, config=config,
                                             init_method=config.output_layer_init_method,
                                             bias=config.add_bias_linear, input_is_parallel=True, skip_bias_add=True)

    def forward(self, hidden_states: torch.Tensor, rotary_pos_emb: torch.Tensor | None = None):
        """hidden_states: [s(/tp with SP), b, h] -> (output [s(/tp), b, h], bias)."""
        mixed, _ = self.linear_qkv(hidden_states)
        s, b = mixed.shape[:2]
        mixed = mixed.view(s, b, self.groups_per_partition, self.heads_per_group + 2, self.hd)
        q = mixed[:, :, :, : self.heads_per_group].reshape(s, b, -1, self.hd)
        k, v = mixed[:, :, :, -2], mixed[:, :, :, -1]
        if rotary_pos_emb is not None:
            q, k = apply_rotary_pos_emb(q, rotary_pos_emb), apply_rotary_pos_emb(k, rotary_pos_emb)
        if self.heads_per_group > 1:
            k = k.repeat_interleave(self.heads_per_group, dim=2)
            v = v.repeat_interleave(self.heads_per_group, dim=2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        p = self.config.attention_dropout if self.training else 0.0
        # heads are sharded over TP ranks: their dropout masks must differ per rank
        with get_cuda_rng_tracker().fork():
            ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, -1)
        return self.linear_proj(ctx)
