"""``hf_lite.models.gemma.modeling_gemma`` (transformers' path): Gemma's models; their differences from
Llama's blocks are in ``_compat/models/gemma.py``."""

from ..._compat.models.gemma import (
    GemmaForCausalLM,
    GemmaForSequenceClassification,
    GemmaModel,
    GemmaPreTrainedModel,
)

__all__ = ["GemmaForCausalLM", "GemmaForSequenceClassification", "GemmaModel", "GemmaPreTrainedModel"]
