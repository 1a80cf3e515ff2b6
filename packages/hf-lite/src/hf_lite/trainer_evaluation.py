"""``Trainer.evaluate`` / ``predict`` (the evaluation half of transformers' ``trainer.py``): a no-grad pass
over batches, losses and logits gathered from every rank in dataset order, metrics from ``compute_metrics``.

Under several ranks each evaluation batch goes to one rank in turn (rank r takes batches r, r+N, ...; the last
round is completed with repeats of the first batches, which count no tokens and are dropped after gathering), so
every rank computes the same metrics from the same gathered values, and decisions taken on them agree. Predictions
and labels reach ``compute_metrics`` and the caller as numpy arrays, as in transformers."""

from __future__ import annotations

import logging
import math
import time

import torch

from .trainer_pt_utils import find_batch_size, nested_concat, nested_cpu, nested_detach, nested_numpify
from .trainer_utils import EvalLoopOutput, EvalPrediction, PredictionOutput, detensorize, has_length, speed_metrics

logger = logging.getLogger(__name__)


class TrainerEvaluationMixin:
    """Evaluation and prediction; mixed into ``Trainer``."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Loss (and ``compute_metrics``) on ``eval_dataset`` (a dataset, a name in a dict of eval datasets, or the
        Trainer's); logs the metrics and calls ``on_evaluate``."""
        override = eval_dataset is not None
        eval_dataset = eval_dataset if override else self.eval_dataset
        if isinstance(eval_dataset, dict):
            metrics = {}
            for name, dataset in eval_dataset.items():
                metrics.update(self.evaluate(dataset, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        dataloader, padded = self.get_eval_dataloader(eval_dataset)
        start = time.time()
        output = self.evaluation_loop(
            dataloader,
            padded,
            "Evaluation",
            prediction_loss_only=True if self.compute_metrics is None else None,
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        total = self.args.eval_batch_size * self.args.world_size
        output.metrics.update(
            speed_metrics(
                metric_key_prefix,
                start,
                num_samples=output.num_samples,
                num_steps=math.ceil(output.num_samples / total),
            )
        )
        # The main process's metrics for everyone: timings differ by rank, decisions must not.
        metrics = self.parallelism.broadcast_object(output.metrics)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions (numpy logits, right-padded with -100 to one length), labels if present, and metrics."""
        dataloader, padded = self.get_test_dataloader(test_dataset)
        start = time.time()
        output = self.evaluation_loop(
            dataloader, padded, "Prediction", ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
        )
        total = self.args.eval_batch_size * self.args.world_size
        output.metrics.update(
            speed_metrics(
                metric_key_prefix,
                start,
                num_samples=output.num_samples,
                num_steps=math.ceil(output.num_samples / total),
            )
        )
        metrics = self.parallelism.broadcast_object(output.metrics)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)

    def evaluation_loop(
        self,
        dataloader,
        padded_batches: int,
        description: str,
        prediction_loss_only=None,
        ignore_keys=None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        args = self.args
        prediction_loss_only = args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
        model = self.model_wrapped if self.is_in_train else self.model
        model.eval()
        self.callback_handler.eval_dataloader = dataloader
        logger.info("***** Running %s *****  batch size = %d", description, args.eval_batch_size)
        # One entry per rank per step, in dataset order once the ranks' results are interleaved.
        results, observed = [], 0
        world, rank = self.parallelism.world_size, self.parallelism.process_index
        first_padding = len(dataloader) * world - padded_batches if padded_batches else None
        losses = []
        for step, inputs in enumerate(dataloader):
            batch_size = find_batch_size(inputs) or args.eval_batch_size
            padding = first_padding is not None and step * world + rank >= first_padding
            if padding and "labels" in inputs:  # a repeat that only keeps the ranks in step: no tokens of its own
                inputs = {**inputs, "labels": torch.full_like(inputs["labels"], -100)}
            observed += 0 if padding else batch_size
            count = self._get_num_items_in_batch([inputs], distributed=False) if "labels" in inputs else None
            loss, logits, labels = self.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
            if logits is not None and self.preprocess_logits_for_metrics is not None:
                logits = self.preprocess_logits_for_metrics(logits, labels)
            total = None if loss is None else loss * count if count is not None else loss * batch_size
            local = nested_cpu((padding, batch_size, total, count, logits, labels))
            gathered = self.parallelism.all_gather_object(local)
            real = [g for g in gathered if not g[0]]
            if loss is not None and real:
                # Every example gets its step's loss: the token mean over the ranks' batches of that step (one
                # process: its batch's mean, as transformers' per-example eval losses), so N ranks of batch b
                # evaluate as one process of batch N x b.
                counted = [g for g in real if g[3] is not None]
                if len(counted) == len(real):
                    step_loss = sum(g[2] for g in real) / max(sum(g[3] for g in real), 1)
                else:
                    step_loss = sum(g[2] for g in real) / sum(g[1] for g in real)
                losses.append(torch.as_tensor(step_loss).float().repeat(sum(g[1] for g in real)))
            results.extend((g[4], g[5]) for g in real)
            self.control = self.callback_handler.on_prediction_step(args, self.state, self.control)
        all_losses = torch.cat(losses) if losses else None
        all_preds = all_labels = None
        for logits, labels in results:
            all_preds = nested_concat(all_preds, logits) if logits is not None else all_preds
            all_labels = nested_concat(all_labels, labels) if labels is not None else all_labels
        # numpy, as transformers hands them to compute_metrics and returns them
        all_preds, all_labels = nested_numpify(all_preds), nested_numpify(all_labels)
        dataset = getattr(dataloader, "dataset", None)
        num_samples = len(dataset) if has_length(dataset) else observed * world
        metrics = {}
        if self.compute_metrics is not None and all_preds is not None and all_labels is not None:
            metrics = detensorize(self.compute_metrics(EvalPrediction(predictions=all_preds, label_ids=all_labels)))
        if all_losses is not None:
            finite = torch.isfinite(all_losses)
            losses = all_losses[finite] if args.logging_nan_inf_filter and finite.any() else all_losses
            metrics["loss"] = losses.float().mean().item()
        metrics = {
            k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": v for k, v in metrics.items()
        }
        return EvalLoopOutput(predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples)

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """(loss, logits, labels) of one batch without gradients; logits exclude the loss and ignored keys."""
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            config = getattr(self.model, "config", None)
            ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", [])) or ["past_key_values"]
        labels = None
        if has_labels:
            labels = nested_detach(tuple(inputs.get(name) for name in self.label_names))
            labels = labels[0] if len(labels) == 1 else labels
        with torch.no_grad():
            with self.compute_loss_context_manager():
                if has_labels:  # this batch's own token mean; evaluation_loop combines the ranks' batches
                    num_items = self._get_num_items_in_batch([inputs], distributed=False)
                    loss, outputs = self.compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items)
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
        logits = logits[0] if len(logits) == 1 else logits
        return loss, logits, labels
