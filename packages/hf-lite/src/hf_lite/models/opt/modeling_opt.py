"""``hf_lite.models.opt.modeling_opt`` (transformers' path): OPT's models; their differences from
Llama's blocks are in ``_compat/models/opt.py``."""

from ..._compat.models.opt import (
    OPTForCausalLM,
    OPTForSequenceClassification,
    OPTModel,
    OPTPreTrainedModel,
)

__all__ = ["OPTForCausalLM", "OPTForSequenceClassification", "OPTModel", "OPTPreTrainedModel"]
