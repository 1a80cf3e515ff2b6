"""``hf_lite.models.qwen2.modeling_qwen2`` (transformers' path): Qwen2's models; their differences from
Llama's blocks are in ``_compat/models/qwen2.py``."""

from ..._compat.models.qwen2 import (
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2Model,
    Qwen2PreTrainedModel,
)

__all__ = ["Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "Qwen2Model", "Qwen2PreTrainedModel"]
