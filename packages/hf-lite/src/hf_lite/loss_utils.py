"""Causal-LM loss (transformers' ``ForCausalLMLoss``): predict token t+1 from position t, ignore -100 labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modeling_outputs import CausalLMOutputWithPast


def causal_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100, num_items_in_batch=None, **kwargs
) -> torch.Tensor:
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} does not match logits {tuple(logits.shape[:-1])}")
    logits = logits.float()
    # Shift by padding the labels (not slicing the logits) so every position keeps its row, like transformers.
    shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(
        logits.view(-1, logits.shape[-1]), shift_labels.view(-1).to(logits.device),
        ignore_index=ignore_index, reduction=reduction,
    )
    if num_items_in_batch is not None:
        loss = loss / num_items_in_batch
    return loss


def causal_lm_output(lm_head, base_output, labels=None, logits_to_keep: int = 0, **loss_kwargs):
    """The shared tail of every ``*ForCausalLM.forward``: project the last ``logits_to_keep`` positions (all when 0)
    through the LM head, add the shifted loss when labels are given."""
    hidden = base_output.last_hidden_state
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    logits = lm_head(hidden)
    loss = causal_lm_loss(logits, labels, **loss_kwargs) if labels is not None else None
    return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=base_output.past_key_values)
