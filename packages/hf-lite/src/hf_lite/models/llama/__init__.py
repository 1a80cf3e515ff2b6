"""Llama (``transformers.models.llama``); the sequence-classification head is in ``_compat/models``."""

from ..._compat.models.llama import LlamaForSequenceClassification
from .configuration_llama import LlamaConfig
from .modeling_llama import LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel

__all__ = ["LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification", "LlamaModel", "LlamaPreTrainedModel"]
