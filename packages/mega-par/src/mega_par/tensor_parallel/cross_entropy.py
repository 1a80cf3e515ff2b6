"""Cross-entropy over vocab-parallel logits without gathering them (Megatron ``cross_entropy.py``).

Each TP rank holds logits for its slice of the vocabulary. Two all-reduces over the TP group
(the max for stability, then the target logit and the sum of exponentials stacked in one tensor)
give the exact loss; the full ``[..., vocab]`` tensor never exists. The group is ``tp_group`` when given,
else parallel_state's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par.parallel_state import get_tensor_model_parallel_group


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
        group = get_tensor_model_parallel_group() if tp_group is None else tp_group
        tp = group.size()
        logits = vocab_parallel_logits.float()
        logits_max = logits.max(dim=-1).values
        if tp > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - logits_max.unsqueeze(-1)

        partition = logits.shape[-1]
        start = group.rank() * partition
        target_mask = (target < start) | (target >= start + partition)
        masked_target = (target - start).masked_fill(target_mask, 0)
        predicted = logits.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1).masked_fill(target_mask, 0.0)
        exp_logits = logits.exp()
        sum_exp = exp_logits.sum(dim=-1)
        vocab_size = partition * tp
        if label_smoothing > 0:
            # F.cross_entropy's smoothing term needs sum_j log p_j = sum_j logits_j - V * log(sum_exp)
            sum_logits = logits.sum(dim=-1)
            stacked = torch.stack([predicted, sum_exp, sum_logits])
        else:
            stacked = torch.stack([predicted, sum_exp])
        if tp > 1:
            dist.all_reduce(stacked, group=group)
        predicted, sum_exp = stacked[0], stacked[1]
        log_sum_exp = sum_exp.log()
        loss = log_sum_exp - predicted
        if label_smoothing > 0:
            mean_neg_log_p = log_sum_exp - stacked[2] / vocab_size
            loss = (1.0 - label_smoothing) * loss + label_smoothing * mean_neg_log_p

        ctx.label_smoothing, ctx.vocab_size, ctx.in_dtype = label_smoothing, vocab_size, vocab_parallel_logits.dtype
        ctx.save_for_backward(exp_logits / sum_exp.unsqueeze(-1), target_mask, masked_target)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target = ctx.saved_tensors
        grad = softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, masked_target.unsqueeze(-1), 1.0)
        onehot = onehot * (~target_mask).unsqueeze(-1)
        ls = ctx.label_smoothing
        grad = grad - (1.0 - ls) * onehot - ls / ctx.vocab_size
        return (grad * grad_output.unsqueeze(-1)).to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, label_smoothing: float = 0.0, tp_group=None):
    """Per-token loss (no reduction), equal to ``F.cross_entropy(full_logits, target, reduction='none')``."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, label_smoothing, tp_group)
