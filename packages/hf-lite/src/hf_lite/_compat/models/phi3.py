"""Phi-3 (Abdin et al. 2024): Mistral's blocks with one fused ``qkv_proj`` and one fused ``gate_up_proj``, and residual
dropout (transformers' ``modular_phi3.py``)."""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaPreTrainedModel
from .mistral import MistralConfig, MistralModel
from .sequence_classification import GenericForSequenceClassification


class Phi3Config(MistralConfig):
    model_type = "phi3"

    def __init__(self, vocab_size: int = 32064, hidden_size: int = 3072, intermediate_size: int = 8192,
                 num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int | None = None,
                 resid_pdrop: float = 0.0, embd_pdrop: float = 0.0, attention_dropout: float = 0.0,
                 hidden_act: str = "silu", max_position_embeddings: int = 4096,
                 original_max_position_embeddings: int = 4096, initializer_range: float = 0.02,
                 rms_norm_eps: float = 1e-5, use_cache: bool = True, tie_word_embeddings: bool = False,
                 rope_parameters: dict | None = None,
                 bos_token_id: int | None = 1, eos_token_id: int | list[int] | None = 32000,
                 pad_token_id: int | None = 32000, sliding_window: int | None = None, **kwargs):
        partial = kwargs.pop("partial_rotary_factor", None)
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, attention_dropout=attention_dropout,
                         hidden_act=hidden_act, max_position_embeddings=max_position_embeddings,
                         initializer_range=initializer_range, rms_norm_eps=rms_norm_eps,
                         tie_word_embeddings=tie_word_embeddings, rope_parameters=rope_parameters,
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                         sliding_window=sliding_window, **kwargs)
        self.rope_parameters.setdefault("partial_rotary_factor", 1.0 if partial is None else partial)
        if self.rope_parameters["partial_rotary_factor"] != 1.0:
            raise ValueError(f"Phi3Config: partial_rotary_factor={self.rope_parameters['partial_rotary_factor']}; "
                             "hf-lite's Phi-3 rotates the whole head (1.0) only")
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.original_max_position_embeddings = original_max_position_embeddings


class Phi3Attention(LlamaAttention):
    """Llama's attention with q, k and v from one projection, split in that order."""

    def __init__(self, config: Phi3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        del self.q_proj, self.k_proj, self.v_proj
        self.split = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.split), bias=False)

    def project_qkv(self, hidden_states):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        return (t.view(shape).transpose(1, 2) for t in self.qkv_proj(hidden_states).split(self.split, dim=-1))


class Phi3MLP(nn.Module):
    """SwiGLU with gate and up in one projection: ``down(up * act(gate))``."""

    def __init__(self, config: Phi3Config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.activation_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * self.activation_fn(gate))


class Phi3DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: Phi3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Phi3Attention(config, layer_idx)
        self.mlp = Phi3MLP(config)
        self.resid_attn_dropout = nn.Dropout(config.resid_pdrop)
        self.resid_mlp_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, output_attentions=False):
        attn, weights = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, cache,
                                       output_attentions)
        h = hidden_states + self.resid_attn_dropout(attn)
        return h + self.resid_mlp_dropout(self.mlp(self.post_attention_layernorm(h))), weights


class Phi3PreTrainedModel(LlamaPreTrainedModel):
    config_class = Phi3Config
    _no_split_modules = ["Phi3DecoderLayer"]


class Phi3Model(Phi3PreTrainedModel, MistralModel):
    decoder_layer_class = Phi3DecoderLayer


class Phi3ForCausalLM(Phi3PreTrainedModel, LlamaForCausalLM):
    base_model_class = Phi3Model


class Phi3ForSequenceClassification(GenericForSequenceClassification, Phi3PreTrainedModel):
    base_model_class = Phi3Model
