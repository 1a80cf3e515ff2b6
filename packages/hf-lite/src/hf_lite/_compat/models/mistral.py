"""Mistral (Jiang et al. 2023): Llama's blocks under sliding-window attention, each query seeing the last
``sliding_window`` positions only (transformers' ``modular_mistral.py``: the mask is the difference)."""

from __future__ import annotations

import torch

from ...models.llama.configuration_llama import LlamaConfig
from ...models.llama.modeling_llama import LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel
from .sequence_classification import GenericForSequenceClassification


class MistralConfig(LlamaConfig):
    model_type = "mistral"
    _derived_attributes = ("attention_bias", "mlp_bias")  # Llama's switches, fixed off here

    def __init__(self, vocab_size: int = 32000, hidden_size: int = 4096, intermediate_size: int = 14336,
                 num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int = 8,
                 head_dim: int | None = None, hidden_act: str = "silu", max_position_embeddings: int = 4096 * 32,
                 initializer_range: float = 0.02, rms_norm_eps: float = 1e-6, use_cache: bool = True,
                 pad_token_id: int | None = None,
                 bos_token_id: int | None = 1, eos_token_id: int | list[int] | None = 2,
                 tie_word_embeddings: bool = False, rope_parameters: dict | None = None,
                 sliding_window: int | None = 4096, attention_dropout: float = 0.0, **kwargs):
        for fixed in self._derived_attributes:
            kwargs.pop(fixed, None)
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim, hidden_act=hidden_act,
                         max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
                         rms_norm_eps=rms_norm_eps, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         rope_parameters=rope_parameters, attention_dropout=attention_dropout, **kwargs)
        if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window <= 0):
            raise ValueError(f"{type(self).__name__}.sliding_window must be a positive int or None, "
                             f"got {sliding_window!r}")
        self.sliding_window = sliding_window


def sliding_window_causal_mask(attention_mask: torch.Tensor | None, query_length: int, past_length: int,
                               sliding_window: int, device) -> torch.Tensor:
    """A ``(batch|1, 1, q, past + q)`` bool mask: causal, within the window (transformers'
    ``sliding_window_overlay``: key ``k`` is seen from query ``q`` when ``q - window < k <= q``) and not padding."""
    q_pos = torch.arange(query_length, device=device)[:, None] + past_length
    k_pos = torch.arange(past_length + query_length, device=device)[None, :]
    allowed = ((k_pos <= q_pos) & (k_pos > q_pos - sliding_window))[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool().to(device)
    return allowed


class MistralPreTrainedModel(LlamaPreTrainedModel):
    config_class = MistralConfig


class MistralModel(MistralPreTrainedModel, LlamaModel):
    """Llama's model; with a ``sliding_window`` the 2D padding mask becomes the windowed 4D mask before the layers."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                **kwargs):
        window = getattr(self.config, "sliding_window", None)
        inputs = input_ids if input_ids is not None else inputs_embeds
        if window is not None and inputs is not None and (attention_mask is None or attention_mask.dim() == 2):
            past = past_key_values if past_key_values is not None else kwargs.get("cache")
            past_length = past.get_seq_length() if hasattr(past, "get_seq_length") else 0
            if isinstance(past, (tuple, list)) and past:  # a legacy ((k, v), ...) cache
                past_length = past[0][0].shape[-2]
            attention_mask = sliding_window_causal_mask(attention_mask, inputs.shape[1], past_length, window,
                                                        inputs.device)
        return super().forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, **kwargs)


class MistralForCausalLM(MistralPreTrainedModel, LlamaForCausalLM):
    base_model_class = MistralModel


class MistralForSequenceClassification(GenericForSequenceClassification, MistralPreTrainedModel):
    base_model_class = MistralModel
