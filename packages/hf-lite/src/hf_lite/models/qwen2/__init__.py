"""Qwen2 (``transformers.models.qwen2``)."""

from .configuration_qwen2 import Qwen2Config
from .modeling_qwen2 import (
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2Model,
    Qwen2PreTrainedModel,
)

__all__ = ["Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "Qwen2Model", "Qwen2PreTrainedModel"]
