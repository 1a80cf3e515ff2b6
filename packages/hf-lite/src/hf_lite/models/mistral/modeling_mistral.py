"""``hf_lite.models.mistral.modeling_mistral`` (transformers' path): Mistral's models; their differences from
Llama's blocks are in ``_compat/models/mistral.py``."""

from ..._compat.models.mistral import (
    MistralForCausalLM,
    MistralForSequenceClassification,
    MistralModel,
    MistralPreTrainedModel,
)

__all__ = ["MistralForCausalLM", "MistralForSequenceClassification", "MistralModel", "MistralPreTrainedModel"]
