"""``hf_lite.models.qwen3.modeling_qwen3`` (transformers' path): Qwen3's models; their differences from
Llama's blocks are in ``_compat/models/qwen3.py``."""

from ..._compat.models.qwen3 import (
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
    Qwen3PreTrainedModel,
)

__all__ = ["Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "Qwen3Model", "Qwen3PreTrainedModel"]
