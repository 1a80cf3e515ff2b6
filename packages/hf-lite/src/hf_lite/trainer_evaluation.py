"""The Trainer's evaluation loop (transformers' ``Trainer.evaluation_loop`` and ``prediction_step``): a no-grad pass
over the rank's batches, losses and logits gathered from every rank in dataset order. The ``Trainer``
(``trainer_loop.py``) takes these functions as its methods, so a subclass may still override either."""

from __future__ import annotations

import logging

import torch

from .trainer_pt_utils import find_batch_size, nested_concat, nested_cpu, nested_detach, nested_numpify
from .trainer_utils import EvalLoopOutput, EvalPrediction, detensorize, has_length

logger = logging.getLogger(__name__)


def evaluation_loop(trainer, dataloader, padded_batches: int, description: str, prediction_loss_only=None,
                    ignore_keys=None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
    """A no-grad pass over the rank's batches; each step's losses and logits gathered from every rank, in
    dataset order; predictions and labels reach ``compute_metrics`` as numpy arrays, as in transformers."""
    args = trainer.args
    prediction_loss_only = args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
    model = trainer.model_wrapped if trainer.is_in_train else trainer.model
    model.eval()
    trainer.callback_handler.eval_dataloader = dataloader
    logger.info("***** Running %s *****  batch size = %d", description, args.eval_batch_size)
    results, observed, losses = [], 0, []  # results: one entry per rank per step, in dataset order
    world, rank = trainer.parallelism.world_size, trainer.parallelism.process_index
    first_padding = len(dataloader) * world - padded_batches if padded_batches else None
    for step, inputs in enumerate(dataloader):
        batch_size = find_batch_size(inputs) or args.eval_batch_size
        padding = first_padding is not None and step * world + rank >= first_padding
        if padding and "labels" in inputs:  # a repeat that only keeps the ranks in step: no tokens of its own
            inputs = {**inputs, "labels": torch.full_like(inputs["labels"], -100)}
        observed += 0 if padding else batch_size
        count = trainer._get_num_items_in_batch([inputs], distributed=False) if "labels" in inputs else None
        loss, logits, labels = trainer.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, labels)
        total = None if loss is None else loss * count if count is not None else loss * batch_size
        real = [g for g in trainer.parallelism.all_gather_object(
            nested_cpu((padding, batch_size, total, count, logits, labels, loss))) if not g[0]]
        if loss is not None and len(real) == 1:  # one batch: its own mean (total / count would round it again)
            losses.append(real[0][6].float().repeat(real[0][1]))
        elif loss is not None and real:
            # Every example gets its step's loss: the token mean over the ranks' batches of that step (one
            # process: its batch's mean, as transformers' per-example eval losses), so N ranks of batch b
            # evaluate as one process of batch N x b.
            if all(g[3] is not None for g in real):
                step_loss = sum(g[2] for g in real) / max(sum(g[3] for g in real), 1)
            else:
                step_loss = sum(g[2] for g in real) / sum(g[1] for g in real)
            losses.append(torch.as_tensor(step_loss).float().repeat(sum(g[1] for g in real)))
        results.extend((g[4], g[5]) for g in real)
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
    all_preds = all_labels = None
    for logits, labels in results:
        all_preds = nested_concat(all_preds, logits) if logits is not None else all_preds
        all_labels = nested_concat(all_labels, labels) if labels is not None else all_labels
    all_preds, all_labels = nested_numpify(all_preds), nested_numpify(all_labels)
    dataset = getattr(dataloader, "dataset", None)
    num_samples = len(dataset) if has_length(dataset) else observed * world
    metrics = {}
    if trainer.compute_metrics is not None and all_preds is not None and all_labels is not None:
        metrics = detensorize(trainer.compute_metrics(EvalPrediction(predictions=all_preds, label_ids=all_labels)))
    if losses:
        all_losses = torch.cat(losses)
        finite = torch.isfinite(all_losses)
        # numpy's float32 mean, as transformers takes it (torch sums in another order)
        kept = all_losses[finite] if args.logging_nan_inf_filter and finite.any() else all_losses
        metrics[f"{metric_key_prefix}_loss"] = kept.float().numpy().mean().item()
    # Prefixed keys first, then the others prefixed, in transformers' order (it pops and re-inserts them).
    metrics = {k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": v
               for k, v in sorted(metrics.items(), key=lambda kv: not kv[0].startswith(f"{metric_key_prefix}_"))}
    return EvalLoopOutput(predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples)


def prediction_step(trainer, model, inputs, prediction_loss_only: bool, ignore_keys=None):
    """(loss, logits, labels) of one batch without gradients; logits exclude the loss and ignored keys."""
    has_labels = bool(trainer.label_names) and all(inputs.get(k) is not None for k in trainer.label_names)
    inputs = trainer._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(trainer.model, "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", [])) or ["past_key_values"]
    labels = None
    if has_labels:
        labels = nested_detach(tuple(inputs.get(name) for name in trainer.label_names))
        labels = labels[0] if len(labels) == 1 else labels
    with torch.no_grad(), trainer.compute_loss_context_manager():
        if has_labels:  # this batch's own token mean; evaluation_loop combines the ranks' batches
            num_items = trainer._get_num_items_in_batch([inputs], distributed=False)
            loss, outputs = trainer.compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items)
            loss = loss.detach().mean()
        else:
            loss, outputs = None, model(**inputs)
    if prediction_loss_only:
        return loss, None, None
    if isinstance(outputs, dict):
        logits = tuple(v for k, v in outputs.items() if k not in ignore_keys + ["loss"])
    else:
        logits = outputs[1:] if has_labels else outputs
    logits = nested_detach(logits)
    return loss, logits[0] if len(logits) == 1 else logits, labels
