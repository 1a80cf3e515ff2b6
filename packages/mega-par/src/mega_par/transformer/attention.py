"""Self-attention split by heads over TP ranks (Megatron-LM arXiv 1909.08053 §3, Fig. 3b;
``megatron/core/transformer/attention.py``).

``linear_qkv`` is column-parallel (each rank owns whole query groups), ``linear_proj`` row-parallel, so
the block costs one ``f`` and one ``g``. The fused QKV weight uses Megatron's grouped layout
``[group0: q heads, k, v | group1: ...]`` so a contiguous column slice is a set of complete groups.
The modules come from ``SelfAttentionSubmodules`` (the layer spec): the two linears, the core attention
and optional per-head q/k norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.transformer.enums import AttnMaskType
from mega_par.transformer.identity_op import IdentityOp
from mega_par.transformer.module import MegatronModule
from mega_par.transformer.spec_utils import build_module


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer), rotate-half convention as in Llama; Megatron's signature
    (``models/common/embeddings/rotary_pos_embedding.py``), its variants other than the whole head refused by name."""

    def __init__(self, kv_channels: int, rotary_percent: float = 1.0, rotary_interleaved: bool = False,
                 seq_len_interpolation_factor: float | None = None, rotary_base: float = 10000,
                 rope_scaling: bool = False, rope_scaling_factor: float = 8.0, use_cpu_initialization: bool = False,
                 cp_group=None):
        super().__init__()
        for name, value, default in (("rotary_percent", rotary_percent, 1.0),
                                     ("rotary_interleaved", rotary_interleaved, False),
                                     ("seq_len_interpolation_factor", seq_len_interpolation_factor, None),
                                     ("rope_scaling", rope_scaling, False)):
            if value != default:
                raise ValueError(f"RotaryEmbedding: {name}={value!r} is not supported by mega_par (only {default!r})")
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, kv_channels, 2, dtype=torch.float32) / kv_channels))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False) -> torch.Tensor:
        """The angles of positions ``offset .. offset + max_seq_len - 1``: ``[s, 1, 1, d]``, as Megatron's."""
        if packed_seq:
            raise ValueError("RotaryEmbedding: packed_seq=True is not supported by mega_par")
        pos = torch.arange(offset, offset + max_seq_len, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(pos, self.inv_freq)
        return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """t: [s, b, heads, d]; freqs: [s, 1, 1, d] (or [s, d])."""
    if freqs.dim() == 2:
        freqs = freqs[:, None, None, :]
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    x1, x2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-x2, x1], dim=-1) * sin


@dataclass
class SelfAttentionSubmodules:
    linear_qkv: object = None
    core_attention: object = None
    linear_proj: object = None
    q_layernorm: object = None
    k_layernorm: object = None


class SelfAttention(MegatronModule):
    def __init__(self, config, submodules: SelfAttentionSubmodules, layer_number: int,
                 attn_mask_type: AttnMaskType = AttnMaskType.padding, cp_comm_type: str | None = None,
                 pg_collection=None):
        super().__init__(config=config)
        tp = ps.get_tensor_model_parallel_world_size()
        self.layer_number, self.attn_mask_type = layer_number, attn_mask_type
        if config.num_query_groups % tp:
            raise ValueError(f"num_query_groups ({config.num_query_groups}) must be divisible by the "
                             f"tensor-parallel size ({tp})")
        self.hd = config.kv_channels
        self.groups_per_partition = config.num_query_groups // tp
        self.heads_per_group = config.num_attention_heads // config.num_query_groups
        qkv_size = (config.num_attention_heads + 2 * config.num_query_groups) * self.hd
        self.linear_qkv = build_module(submodules.linear_qkv, config.hidden_size, qkv_size, config=config,
                                       init_method=config.init_method,
                                       bias=config.add_bias_linear or config.add_qkv_bias, gather_output=False)
        self.core_attention = build_module(submodules.core_attention, config=config, layer_number=layer_number,
                                           attn_mask_type=attn_mask_type, attention_type="self")
        self.linear_proj = build_module(submodules.linear_proj, config.num_attention_heads * self.hd,
                                        config.hidden_size, config=config,
                                        init_method=config.output_layer_init_method, bias=config.add_bias_linear,
                                        input_is_parallel=True, skip_bias_add=True)
        norm_kw = dict(hidden_size=self.hd, config=config, eps=config.layernorm_epsilon)
        self.q_layernorm = build_module(submodules.q_layernorm or IdentityOp, **norm_kw)
        self.k_layernorm = build_module(submodules.k_layernorm or IdentityOp, **norm_kw)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                rotary_pos_emb: torch.Tensor | None = None):
        """hidden_states: [s(/tp with SP), b, h] -> (output [s(/tp), b, h], bias)."""
        mixed, _ = self.linear_qkv(hidden_states)
        s, b = mixed.shape[:2]
        mixed = mixed.view(s, b, self.groups_per_partition, self.heads_per_group + 2, self.hd)
        q = mixed[:, :, :, : self.heads_per_group].reshape(s, b, -1, self.hd)
        k, v = mixed[:, :, :, -2], mixed[:, :, :, -1]
        q, k = self.q_layernorm(q), self.k_layernorm(k)
        if rotary_pos_emb is not None:
            q, k = apply_rotary_pos_emb(q, rotary_pos_emb), apply_rotary_pos_emb(k, rotary_pos_emb)
        ctx = self.core_attention(q, k, v, attention_mask)
        return self.linear_proj(ctx)
