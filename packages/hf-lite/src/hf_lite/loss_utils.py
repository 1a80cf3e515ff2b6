"""Causal-LM loss (transformers' ``ForCausalLMLoss``): predict token t+1 from position t, ignore -100 labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modeling_outputs import CausalLMOutputWithPast


def ForCausalLMLoss(  # noqa: N802 -- transformers' name, looked up through LOSS_MAPPING
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over non-ignored tokens, or their sum / ``num_items_in_batch`` (what gradient accumulation needs)."""
    if shift_labels is None:
        if labels.shape != logits.shape[:-1]:
            raise ValueError(f"labels shape {tuple(labels.shape)} does not match logits {tuple(logits.shape[:-1])}")
        # Shift by padding the labels (not slicing the logits) so every position keeps its row, like transformers.
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    logits = logits.float()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits.view(-1, vocab_size or logits.shape[-1]), shift_labels.view(-1).to(logits.device),
                           ignore_index=ignore_index, reduction=reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


LOSS_MAPPING = {"ForCausalLM": ForCausalLMLoss}
LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


def _return_dict(model, return_dict) -> bool:
    """``return_dict`` when given, else ``config.return_dict`` (transformers' ``can_return_tuple``)."""
    return return_dict if return_dict is not None else getattr(model.config, "return_dict", True)


def causal_lm_output(model, base_output, labels=None, logits_to_keep: int = 0, return_dict=None, **loss_kwargs):
    """The shared tail of every ``*ForCausalLM.forward``: project the last ``logits_to_keep`` positions (all when 0)
    through the LM head, add ``model.loss_function``'s loss when labels are given."""
    unknown = sorted(set(loss_kwargs) - set(LOSS_KWARGS))
    if unknown:
        raise TypeError(f"{type(model).__name__}.forward() got unexpected keyword arguments {unknown}")
    hidden = base_output.last_hidden_state
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    logits = model.lm_head(hidden)
    loss = None
    if labels is not None:
        loss = model.loss_function(logits, labels, vocab_size=model.config.vocab_size, **loss_kwargs)
    out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=base_output.past_key_values,
                                 hidden_states=base_output.hidden_states, attentions=base_output.attentions)
    return out if _return_dict(model, return_dict) else out.to_tuple()
