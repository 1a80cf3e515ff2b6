"""GPT-2 (``transformers.models.gpt2``); the sequence-classification head is in ``_compat/models``."""

from ..._compat.models.gpt2 import GPT2ForSequenceClassification
from .configuration_gpt2 import GPT2Config
from .modeling_gpt2 import GPT2LMHeadModel, GPT2Model, GPT2PreTrainedModel

__all__ = ["GPT2Config", "GPT2ForSequenceClassification", "GPT2LMHeadModel", "GPT2Model", "GPT2PreTrainedModel"]
