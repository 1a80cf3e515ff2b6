"""Qwen2 (Qwen team 2024): Llama's blocks with biased query/key/value projections (transformers'
``modular_qwen2.py``)."""

from __future__ import annotations

from torch import nn

from ...models.llama.configuration_llama import LlamaConfig
from ...models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
)
from .sequence_classification import GenericForSequenceClassification


class Qwen2Config(LlamaConfig):
    model_type = "qwen2"
    _derived_attributes = ("attention_bias", "mlp_bias")

    def __init__(self, vocab_size: int = 151936, hidden_size: int = 4096, intermediate_size: int = 22016,
                 num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int | None = 32,
                 hidden_act: str = "silu", max_position_embeddings: int = 32768, initializer_range: float = 0.02,
                 rms_norm_eps: float = 1e-6, use_cache: bool = True, tie_word_embeddings: bool = False,
                 rope_parameters: dict | None = None,
                 use_sliding_window: bool = False, sliding_window: int | None = 4096, max_window_layers: int = 28,
                 layer_types: list[str] | None = None, attention_dropout: float = 0.0, pad_token_id: int | None = None,
                 bos_token_id: int | None = None, eos_token_id: int | list[int] | None = None, **kwargs):
        for fixed in self._derived_attributes:
            kwargs.pop(fixed, None)
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, hidden_act=hidden_act,
                         max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
                         rms_norm_eps=rms_norm_eps, tie_word_embeddings=tie_word_embeddings,
                         rope_parameters=rope_parameters, attention_dropout=attention_dropout,
                         pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
        set_layer_types(self, use_sliding_window, sliding_window, max_window_layers, layer_types)


def set_layer_types(config, use_sliding_window, sliding_window, max_window_layers, layer_types) -> None:
    """Qwen's per-layer attention kinds, as transformers derives them; hf-lite runs full attention only, so a
    checkpoint with sliding-window layers is refused by name."""
    config.use_sliding_window = use_sliding_window
    config.sliding_window = sliding_window if use_sliding_window else None
    config.max_window_layers = max_window_layers
    if layer_types is None:
        layer_types = ["sliding_attention" if config.sliding_window is not None and i >= max_window_layers
                       else "full_attention" for i in range(config.num_hidden_layers)]
    config.layer_types = list(layer_types)
    if any(kind != "full_attention" for kind in config.layer_types):
        raise ValueError(f"{type(config).__name__}: layer_types {config.layer_types} has sliding-window layers "
                         "(use_sliding_window=True); hf-lite runs Qwen with full attention only")


class Qwen2Attention(LlamaAttention):
    """Llama's attention; q/k/v carry a bias, o_proj does not."""

    def __init__(self, config: Qwen2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        hidden, kv_width = config.hidden_size, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, kv_width, bias=True)
        self.v_proj = nn.Linear(hidden, kv_width, bias=True)


class Qwen2DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: Qwen2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen2Attention(config, layer_idx)


class Qwen2PreTrainedModel(LlamaPreTrainedModel):
    config_class = Qwen2Config
    _no_split_modules = ["Qwen2DecoderLayer"]


class Qwen2Model(Qwen2PreTrainedModel, LlamaModel):
    decoder_layer_class = Qwen2DecoderLayer


class Qwen2ForCausalLM(Qwen2PreTrainedModel, LlamaForCausalLM):
    base_model_class = Qwen2Model


class Qwen2ForSequenceClassification(GenericForSequenceClassification, Qwen2PreTrainedModel):
    base_model_class = Qwen2Model
