"""Gemma (Gemma team 2024): Llama's blocks with embeddings scaled by sqrt(hidden_size), an RMSNorm that multiplies
by (1 + weight) in float32, a GeGLU MLP (tanh GELU) and the head tied to the embeddings (transformers'
``modular_gemma.py``)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ...models.llama.configuration_llama import LlamaConfig
from ...models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel
from .sequence_classification import GenericForSequenceClassification

logger = logging.getLogger(__name__)


class GemmaConfig(LlamaConfig):
    model_type = "gemma"
    _derived_attributes = ("mlp_bias",)

    def __init__(self, vocab_size: int = 256000, hidden_size: int = 3072, intermediate_size: int = 24576,
                 num_hidden_layers: int = 28, num_attention_heads: int = 16, num_key_value_heads: int = 16,
                 head_dim: int = 256, hidden_act: str = "gelu_pytorch_tanh", max_position_embeddings: int = 8192,
                 initializer_range: float = 0.02, rms_norm_eps: float = 1e-6, use_cache: bool = True,
                 pad_token_id: int | None = 0,
                 eos_token_id: int | list[int] | None = 1, bos_token_id: int | None = 2,
                 tie_word_embeddings: bool = True, rope_parameters: dict | None = None, attention_bias: bool = False,
                 attention_dropout: float = 0.0, use_bidirectional_attention: bool | None = None, **kwargs):
        kwargs.pop("mlp_bias", None)
        if hidden_act == "gelu":  # the released configs' value; the checkpoints were trained with the tanh GELU
            logger.warning('We found `hidden_act="gelu"` in this Gemma config. This is a legacy value of the official '
                           'releases but it is meant to target the tanh approximation. Setting '
                           '`hidden_act="gelu_pytorch_tanh"` instead.')
            hidden_act = "gelu_pytorch_tanh"
        if use_bidirectional_attention:
            raise ValueError("GemmaConfig(use_bidirectional_attention=True): hf-lite's Gemma is causal only")
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim, hidden_act=hidden_act,
                         max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
                         rms_norm_eps=rms_norm_eps, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                         bos_token_id=bos_token_id, tie_word_embeddings=tie_word_embeddings,
                         rope_parameters=rope_parameters, attention_bias=attention_bias,
                         attention_dropout=attention_dropout, **kwargs)
        self.use_bidirectional_attention = use_bidirectional_attention


class GemmaRMSNorm(nn.Module):
    """RMSNorm around 1: ``x / rms(x) * (1 + weight)``, all in float32 before the cast back (Llama casts first)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: GemmaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class GemmaPreTrainedModel(LlamaPreTrainedModel):
    config_class = GemmaConfig
    _no_split_modules = ["GemmaDecoderLayer"]

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, GemmaRMSNorm):  # zero is the identity of (1 + weight)
            module.weight.data.zero_()


class GemmaModel(GemmaPreTrainedModel, LlamaModel):
    """Llama's model; token embeddings are multiplied by sqrt(hidden_size) rounded to the weights' dtype (transformers'
    ``GemmaTextScaledWordEmbedding``); ``inputs_embeds`` passed in are used as given."""

    decoder_layer_class = GemmaDecoderLayer

    def __init__(self, config: GemmaConfig):
        super().__init__(config)
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                **kwargs):
        if input_ids is not None and inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
            inputs_embeds = inputs_embeds * torch.tensor(self.config.hidden_size**0.5, dtype=inputs_embeds.dtype,
                                                         device=inputs_embeds.device)
            input_ids = None
        return super().forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, **kwargs)


class GemmaForCausalLM(GemmaPreTrainedModel, LlamaForCausalLM):
    base_model_class = GemmaModel


class GemmaForSequenceClassification(GenericForSequenceClassification, GemmaPreTrainedModel):
    base_model_class = GemmaModel
