"""Llama's sequence-classification head (transformers' ``LlamaForSequenceClassification``)."""

from __future__ import annotations

from ...models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel
from .sequence_classification import GenericForSequenceClassification


class LlamaForSequenceClassification(GenericForSequenceClassification, LlamaPreTrainedModel):
    base_model_class = LlamaModel
