"""Phi-3 (``transformers.models.phi3``)."""

from .configuration_phi3 import Phi3Config
from .modeling_phi3 import (
    Phi3ForCausalLM,
    Phi3ForSequenceClassification,
    Phi3Model,
    Phi3PreTrainedModel,
)

__all__ = ["Phi3Config", "Phi3ForCausalLM", "Phi3ForSequenceClassification", "Phi3Model", "Phi3PreTrainedModel"]
