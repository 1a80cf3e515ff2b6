"""``hf_lite.models.phi3.modeling_phi3`` (transformers' path): Phi-3's models; their differences from
Llama's blocks are in ``_compat/models/phi3.py``."""

from ..._compat.models.phi3 import (
    Phi3ForCausalLM,
    Phi3ForSequenceClassification,
    Phi3Model,
    Phi3PreTrainedModel,
)

__all__ = ["Phi3ForCausalLM", "Phi3ForSequenceClassification", "Phi3Model", "Phi3PreTrainedModel"]
