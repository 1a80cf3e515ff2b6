"""Mistral (``transformers.models.mistral``)."""

from .configuration_mistral import MistralConfig
from .modeling_mistral import (
    MistralForCausalLM,
    MistralForSequenceClassification,
    MistralModel,
    MistralPreTrainedModel,
)

__all__ = [
    "MistralConfig",
    "MistralForCausalLM",
    "MistralForSequenceClassification",
    "MistralModel",
    "MistralPreTrainedModel",
]
