"""GPT-2's sequence-classification head (transformers' ``GPT2ForSequenceClassification``)."""

from __future__ import annotations

from ...models.gpt2.modeling_gpt2 import GPT2Model, GPT2PreTrainedModel
from .sequence_classification import GenericForSequenceClassification


class GPT2ForSequenceClassification(GenericForSequenceClassification, GPT2PreTrainedModel):
    """Scored at the last non-pad token; ``token_type_ids`` reach ``GPT2Model`` through ``**kwargs``."""

    base_model_class = GPT2Model
