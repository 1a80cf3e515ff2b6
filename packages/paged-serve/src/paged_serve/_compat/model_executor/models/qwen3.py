"""Qwen3 (vLLM ``models/qwen3.py``; transformers ``Qwen3ForCausalLM``): Llama with an RMSNorm over each query and
key head before RoPE (``q_norm`` / ``k_norm``), no attention biases unless ``attention_bias``."""

from __future__ import annotations

from functools import partial

from paged_serve.model_executor.layers.layernorm import RMSNorm
from paged_serve.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: dict):
        super().__init__(config)
        eps = config.get("rms_norm_eps", 1e-6)
        self.q_norm, self.k_norm = RMSNorm(self.head_dim, eps), RMSNorm(self.head_dim, eps)

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)  # per head: the rows are heads
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata))[0]


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_type = partial(LlamaModel, layer_type=partial(LlamaDecoderLayer, attention_type=Qwen3Attention))
