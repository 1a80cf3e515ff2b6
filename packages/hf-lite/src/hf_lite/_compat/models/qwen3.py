"""Qwen3 (Qwen team 2025): Llama's blocks with an RMSNorm over each query and key head before RoPE, and an explicit
``head_dim`` (transformers' ``modular_qwen3.py``)."""

from __future__ import annotations

from ...models.llama.configuration_llama import LlamaConfig
from ...models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
)
from .qwen2 import set_layer_types
from .sequence_classification import GenericForSequenceClassification


class Qwen3Config(LlamaConfig):
    model_type = "qwen3"
    _derived_attributes = ("mlp_bias",)

    def __init__(self, vocab_size: int = 151936, hidden_size: int = 4096, intermediate_size: int = 22016,
                 num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int | None = 32,
                 head_dim: int = 128, hidden_act: str = "silu", max_position_embeddings: int = 32768,
                 initializer_range: float = 0.02, rms_norm_eps: float = 1e-6, use_cache: bool = True,
                 tie_word_embeddings: bool = False,
                 rope_parameters: dict | None = None, attention_bias: bool = False, use_sliding_window: bool = False,
                 sliding_window: int | None = 4096, max_window_layers: int = 28, layer_types: list[str] | None = None,
                 attention_dropout: float = 0.0, pad_token_id: int | None = None, bos_token_id: int | None = None,
                 eos_token_id: int | list[int] | None = None, **kwargs):
        kwargs.pop("mlp_bias", None)
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim, hidden_act=hidden_act,
                         max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
                         rms_norm_eps=rms_norm_eps, tie_word_embeddings=tie_word_embeddings,
                         rope_parameters=rope_parameters, attention_bias=attention_bias,
                         attention_dropout=attention_dropout, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)
        set_layer_types(self, use_sliding_window, sliding_window, max_window_layers, layer_types)


class Qwen3Attention(LlamaAttention):
    """Llama's attention; ``q_norm`` / ``k_norm`` normalise each head (over ``head_dim``) before RoPE."""

    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def project_qkv(self, hidden_states):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(shape)).transpose(1, 2)
        return q, k, self.v_proj(hidden_states).view(shape).transpose(1, 2)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3Attention(config, layer_idx)


class Qwen3PreTrainedModel(LlamaPreTrainedModel):
    config_class = Qwen3Config
    _no_split_modules = ["Qwen3DecoderLayer"]


class Qwen3Model(Qwen3PreTrainedModel, LlamaModel):
    decoder_layer_class = Qwen3DecoderLayer


class Qwen3ForCausalLM(Qwen3PreTrainedModel, LlamaForCausalLM):
    base_model_class = Qwen3Model


class Qwen3ForSequenceClassification(GenericForSequenceClassification, Qwen3PreTrainedModel):
    base_model_class = Qwen3Model
