"""``*ForSequenceClassification``: a decoder scored at its last non-pad token (transformers'
``GenericForSequenceClassification`` and ``GPT2ForSequenceClassification``), with the loss its ``problem_type``
names (``ForSequenceClassificationLoss``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...loss_utils import LOSS_MAPPING, _return_dict
from ...modeling_outputs import ModelOutput

logger = logging.getLogger(__name__)


@dataclass
class SequenceClassifierOutputWithPast(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: object | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def ForSequenceClassificationLoss(labels: torch.Tensor, pooled_logits: torch.Tensor, config,  # noqa: N802
                                  **kwargs) -> torch.Tensor:
    """MSE for ``regression``, cross entropy for ``single_label_classification``, BCE with logits for
    ``multi_label_classification``; an unset ``problem_type`` is inferred from ``num_labels`` and the labels' dtype
    and written to the config, as transformers does."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    labels = labels.to(pooled_logits.device)
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(pooled_logits.squeeze(), labels.squeeze())
        return F.mse_loss(pooled_logits, labels)
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(pooled_logits.view(-1, num_labels), labels.view(-1), ignore_index=-100)
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(pooled_logits, labels)
    raise ValueError(f"problem_type={config.problem_type!r} is not one of 'regression', "
                     "'single_label_classification', 'multi_label_classification'")


LOSS_MAPPING["ForSequenceClassification"] = ForSequenceClassificationLoss


class GenericForSequenceClassification:
    """Mixed in before a family's ``PreTrainedModel``: ``base_model_class`` under ``base_model_prefix``, then a
    bias-free ``score`` projection read at each row's last token that is not ``pad_token_id`` (either padding side)."""

    base_model_class: type[nn.Module]
    loss_type = "ForSequenceClassification"

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        width = getattr(config, "word_embed_proj_dim", None) or config.hidden_size  # OPT projects out first
        self.score = nn.Linear(width, self.num_labels, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                cache=None, **kwargs) -> SequenceClassifierOutputWithPast:
        # The Trainer passes num_items_in_batch to a forward taking **kwargs; transformers' heads ignore it (mean).
        kwargs.pop("num_items_in_batch", None)
        out = self.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values if past_key_values is not None else cache,
                              inputs_embeds=inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
                              output_hidden_states=output_hidden_states, return_dict=True, **kwargs)
        logits = self.score(out.last_hidden_state)
        batch_size = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        pad_token_id = self.config.pad_token_id
        if pad_token_id is None and batch_size != 1:
            raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
        if pad_token_id is None:
            last = -1
        elif input_ids is not None:  # the rightmost non-pad token: left and right padding alike
            non_pad = (input_ids != pad_token_id).to(logits.device, torch.int32)
            last = (torch.arange(input_ids.shape[-1], device=logits.device, dtype=torch.int32) * non_pad).argmax(-1)
        else:
            last = -1
            logger.warning("%s will not detect padding tokens in `inputs_embeds`. Results may be unexpected if using "
                           "padding tokens in conjunction with `inputs_embeds.`", type(self).__name__)
        pooled_logits = logits[torch.arange(batch_size, device=logits.device), last]
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=pooled_logits, config=self.config)
        output = SequenceClassifierOutputWithPast(loss=loss, logits=pooled_logits,
                                                  past_key_values=out.past_key_values,
                                                  hidden_states=out.hidden_states, attentions=out.attentions)
        return output if _return_dict(self, return_dict) else output.to_tuple()
