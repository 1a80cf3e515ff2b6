"""Llama family on the paged kernels (vLLM ``models/llama.py``; transformers ``LlamaForCausalLM`` weights).

RMSNorm, RoPE (default / linear / llama3 scaling), grouped-query attention, SwiGLU MLP, optional tied embeddings
and biases. As in vLLM, the q/k/v projections are one fused ``qkv_proj`` matmul and gate/up one ``gate_up_proj``;
``load_weights`` stacks transformers' separate tensors into them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from paged_serve.model_executor.layers.attention import Attention, AttentionMetadata
from paged_serve.model_executor.layers.layernorm import RMSNorm
from paged_serve.model_executor.layers.rotary_embedding import RotaryEmbedding
from paged_serve.model_executor.models.utils import check_loaded, rope_parameters
from torch import nn


class LlamaAttention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden = config["hidden_size"]
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config.get("num_key_value_heads") or self.num_heads
        self.head_dim = config.get("head_dim") or hidden // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = bool(config.get("attention_bias", False))
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=bias)
        max_pos = config.get("max_position_embeddings", 2048)
        self.rotary_emb = RotaryEmbedding(self.head_dim, max_pos, rope_parameters(config))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads)

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata))


class LlamaMLP(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, inter = config["hidden_size"], config["intermediate_size"]
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.get('hidden_act')!r} not supported for Llama (only silu)")
        bias = bool(config.get("mlp_bias", False))
        self.intermediate_size = inter
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        eps = config.get("rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], eps)

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        h = hidden_states + self.self_attn(positions, self.input_layernorm(hidden_states), kv_cache, attn_metadata)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config["num_hidden_layers"]))
        rope = self.layers[0].self_attn.rotary_emb
        for layer in self.layers[1:]:  # one table for every layer (vLLM's get_rope cache)
            layer.self_attn.rotary_emb = rope
        self.norm = RMSNorm(config["hidden_size"], config.get("rms_norm_eps", 1e-6))

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        h = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(positions, h, kv_cache, attn_metadata)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    # transformers' separate projections -> (fused parameter, shard index)
    stacked_params_mapping = (
        ("q_proj", "qkv_proj", 0),
        ("k_proj", "qkv_proj", 1),
        ("v_proj", "qkv_proj", 2),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def _shard(self, param: torch.Tensor, fused: str, index: int) -> slice:
        attn, mlp = self.model.layers[0].self_attn, self.model.layers[0].mlp
        if fused == "qkv_proj":
            sizes = [attn.q_size, attn.kv_size, attn.kv_size]
        else:
            sizes = [mlp.intermediate_size] * 2
        start = sum(sizes[:index])
        return slice(start, start + sizes[index])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue  # the embedding is the head
            for part, fused, index in self.stacked_params_mapping:
                if f".{part}." in name:
                    target = name.replace(f".{part}.", f".{fused}.")
                    if target not in params:
                        raise ValueError(f"checkpoint tensor {name!r} has no place in the model ({target!r})")
                    rows = self._shard(params[target], fused, index)
                    shard = params[target].data[rows]
                    if shard.shape != tensor.shape:
                        raise ValueError(f"{name}: shape {tuple(tensor.shape)} != expected {tuple(shard.shape)}")
                    shard.copy_(tensor)
                    loaded.add(f"{target}#{index}")
                    break
            else:
                if name not in params:
                    raise ValueError(f"unexpected tensor {name!r} in the checkpoint")
                if params[name].shape != tensor.shape:
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != expected {tuple(params[name].shape)}")
                params[name].data.copy_(tensor)
                loaded.add(name)
        expected = set()
        for name in params:
            fused = next((f for _, f, _ in self.stacked_params_mapping if f".{f}." in name), None)
            if fused is None:
                expected.add(name)
            else:
                n = sum(1 for _, f, _ in self.stacked_params_mapping if f == fused)
                expected |= {f"{name}#{i}" for i in range(n)}
        if self.tie_word_embeddings:
            expected.discard("lm_head.weight")
        check_loaded(expected, loaded)
