"""Llama family on the paged kernels (vLLM ``models/llama.py``; transformers ``LlamaForCausalLM`` weights).

RMSNorm, RoPE (default / linear / llama3 scaling), grouped-query attention, SwiGLU MLP, optional tied embeddings
and biases, on the tensor-parallel layers (``layers/linear.py``). As in vLLM, the q/k/v projections are one fused
``qkv_proj`` matmul and gate/up one ``gate_up_proj``; ``load_weights`` hands transformers' separate tensors to
their weight loaders, which stack them and keep this rank's slice. The other families of this shape subclass these
layers for their differences (``_compat/model_executor/models/``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from paged_serve.model_executor.layers.attention import Attention, AttentionMetadata
from paged_serve.model_executor.layers.layernorm import RMSNorm
from paged_serve.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from paged_serve.model_executor.layers.rotary_embedding import RotaryEmbedding
from paged_serve.model_executor.layers.vocab_parallel_embedding import (
    LogitsProcessor,
    ParallelLMHead,
    VocabParallelEmbedding,
)
from paged_serve.model_executor.models.utils import load_weights, rope_parameters
from torch import nn


class LlamaAttention(nn.Module):
    """Each rank runs its ``num_heads`` query heads and ``num_kv_heads`` KV heads (``QKVParallelLinear``); the
    output projection is row-parallel."""

    def __init__(self, config: dict, bias: bool | None = None, bias_o_proj: bool | None = None):
        super().__init__()
        hidden = config["hidden_size"]
        self.total_num_heads = config["num_attention_heads"]
        self.total_num_kv_heads = config.get("num_key_value_heads") or self.total_num_heads
        self.head_dim = config.get("head_dim") or hidden // self.total_num_heads
        bias = bool(config.get("attention_bias", False)) if bias is None else bias
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, self.total_num_heads, self.total_num_kv_heads, bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias_o_proj = bias if bias_o_proj is None else bias_o_proj
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, hidden, bias=bias_o_proj)
        max_pos = config.get("max_position_embeddings", 2048)
        self.rotary_emb = RotaryEmbedding(self.head_dim, max_pos, rope_parameters(config))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads)

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata))[0]


class LlamaMLP(nn.Module):
    def __init__(self, config: dict, act_fn=None):
        super().__init__()
        hidden, inter = config["hidden_size"], config["intermediate_size"]
        if act_fn is None and config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.get('hidden_act')!r} not supported for Llama (only silu)")
        bias = bool(config.get("mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter], bias=bias)
        self.down_proj = RowParallelLinear(inter, hidden, bias=bias)
        self.act_fn = act_fn or nn.functional.silu

    def forward(self, x):
        gate, up = self.gate_up_proj(x)[0].chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)[0]


class LlamaDecoderLayer(nn.Module):
    """A pre-norm block; a family that differs only in its attention, MLP or norm passes its own."""

    def __init__(self, config: dict, attention_type=LlamaAttention, mlp_type=LlamaMLP, norm_type=RMSNorm):
        super().__init__()
        eps = config.get("rms_norm_eps", 1e-6)
        self.self_attn = attention_type(config)
        self.mlp = mlp_type(config)
        self.input_layernorm = norm_type(config["hidden_size"], eps)
        self.post_attention_layernorm = norm_type(config["hidden_size"], eps)

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        h = hidden_states + self.self_attn(positions, self.input_layernorm(hidden_states), kv_cache, attn_metadata)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, config: dict, layer_type=LlamaDecoderLayer, norm_type=RMSNorm):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(layer_type(config) for _ in range(config["num_hidden_layers"]))
        rope = self.layers[0].self_attn.rotary_emb
        for layer in self.layers[1:]:  # one table for every layer (vLLM's get_rope cache)
            layer.self_attn.rotary_emb = rope
        self.norm = norm_type(config["hidden_size"], config.get("rms_norm_eps", 1e-6))

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        h = self.get_input_embeddings(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(positions, h, kv_cache, attn_metadata)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    # transformers' separate projections -> (fused parameter, shard id)
    stacked_params_mapping = (
        ("q_proj", "qkv_proj", "q"),
        ("k_proj", "qkv_proj", "k"),
        ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )
    model_type = LlamaModel  # a family's model: its layers, norms and embedding

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.model = self.model_type(config)
        self.lm_head = ParallelLMHead(config["vocab_size"], config["hidden_size"])
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config["vocab_size"])
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim  # per rank: the KV cache's shape

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        load_weights(self, weights, self.stacked_params_mapping, skip=("rotary_emb.inv_freq",))
