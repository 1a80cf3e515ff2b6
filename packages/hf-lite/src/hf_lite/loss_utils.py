"""Causal-LM loss (transformers' ``ForCausalLMLoss``): predict token t+1 from position t, ignore -100 labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
