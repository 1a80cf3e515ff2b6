"""OPT (``transformers.models.opt``)."""

from .configuration_opt import OPTConfig
from .modeling_opt import (
    OPTForCausalLM,
    OPTForSequenceClassification,
    OPTModel,
    OPTPreTrainedModel,
)

__all__ = ["OPTConfig", "OPTForCausalLM", "OPTForSequenceClassification", "OPTModel", "OPTPreTrainedModel"]
