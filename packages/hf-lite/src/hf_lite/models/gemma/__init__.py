"""Gemma (``transformers.models.gemma``)."""

from .configuration_gemma import GemmaConfig
from .modeling_gemma import (
    GemmaForCausalLM,
    GemmaForSequenceClassification,
    GemmaModel,
    GemmaPreTrainedModel,
)

__all__ = ["GemmaConfig", "GemmaForCausalLM", "GemmaForSequenceClassification", "GemmaModel", "GemmaPreTrainedModel"]
