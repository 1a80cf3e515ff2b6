"""Qwen3 (``transformers.models.qwen3``)."""

from .configuration_qwen3 import Qwen3Config
from .modeling_qwen3 import (
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
    Qwen3PreTrainedModel,
)

__all__ = ["Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "Qwen3Model", "Qwen3PreTrainedModel"]
