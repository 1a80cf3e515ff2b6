"""``Trainer.train``: epochs of accumulated optimizer steps with the callbacks' events around them (the training
loop of transformers' ``trainer.py``: ``_inner_training_loop``, ``_run_epoch``, ``_maybe_log_save_evaluate``).

Resuming restores model, optimizer, scheduler, scaler and trainer state, then skips the batches the checkpoint had
already trained on in its epoch at the sampler level (no data is loaded for them); the data order is a function of
(seed, epoch), so the resumed run sees exactly the batches the uninterrupted run saw."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist

from .trainer_callback import ExportableState, TrainerState
from .trainer_pt_utils import SkipBatchSampler
from .trainer_utils import SaveStrategy, TrainOutput, get_last_checkpoint, has_length, sort_checkpoints, speed_metrics

logger = logging.getLogger(__name__)


class TrainerLoopMixin:
    """The training loop; mixed into ``Trainer``."""

    def train(self, resume_from_checkpoint: str | bool | None = None, ignore_keys_for_eval=None) -> TrainOutput:
        """Train; ``resume_from_checkpoint`` is a checkpoint directory, or True for the newest complete one in
        ``output_dir``. None falls back to ``args.resume_from_checkpoint`` (transformers leaves that to scripts)."""
        args = self.args
        if resume_from_checkpoint is None:
            resume_from_checkpoint = args.resume_from_checkpoint
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({args.output_dir})")
        if resume_from_checkpoint is not None and not os.path.isdir(resume_from_checkpoint):
            raise ValueError(f"resume_from_checkpoint={resume_from_checkpoint!r} is not a directory")
        self.is_in_train = True
        try:
            if args.gradient_checkpointing:
                self.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs
                )
            if resume_from_checkpoint is not None:
                self._load_from_checkpoint(resume_from_checkpoint)
            return self._inner_training_loop(resume_from_checkpoint, ignore_keys_for_eval)
        finally:
            self.is_in_train = False

    def _inner_training_loop(self, resume, ignore_keys_for_eval) -> TrainOutput:
        args, plugin = self.args, self.parallelism
        train_dataloader = self.get_train_dataloader()
        gas = args.gradient_accumulation_steps
        if has_length(train_dataloader):
            len_dl = len(train_dataloader)
            updates_per_epoch = max(math.ceil(len_dl / gas), 1)
            max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * updates_per_epoch)
            num_epochs = (
                math.ceil(max_steps / updates_per_epoch) if args.max_steps > 0 else math.ceil(args.num_train_epochs)
            )
            steps_in_epoch = len_dl
            total_batch = args.train_batch_size * gas * plugin.world_size
            # As transformers: the schedule's samples when step-bound, the dataset's when epoch-bound.
            num_train_samples = (
                max_steps * total_batch
                if args.max_steps > 0
                else int(len(train_dataloader.dataset) * args.num_train_epochs)
            )
        else:  # an iterable dataset: epochs until max_steps (each epoch re-iterates it)
            max_steps, num_epochs, updates_per_epoch = args.max_steps, sys.maxsize, args.max_steps
            steps_in_epoch = max_steps * gas
            num_train_samples = max_steps * args.train_batch_size * gas * plugin.world_size

        stateful = [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]
        self.state = TrainerState(stateful_callbacks=stateful, train_batch_size=args.train_batch_size)
        self.state.compute_steps(args, max_steps)
        epochs_trained, steps_trained_in_epoch = 0, 0
        if resume is not None:
            self.state = self._load_trainer_state(resume)
            self._load_callback_state()
            epochs_trained = self.state.global_step // updates_per_epoch
            if not args.ignore_data_skip:
                steps_trained_in_epoch = (self.state.global_step % updates_per_epoch) * gas
        self.state.max_steps, self.state.num_train_epochs = max_steps, num_epochs
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()

        if self._created_lr_scheduler:  # a second train() builds a fresh schedule for its own length
            self.lr_scheduler, self._created_lr_scheduler = None, False
        self.create_optimizer()
        self.model_wrapped, self.optimizer = plugin.prepare(self.model, self.optimizer, args)
        self.create_scheduler(max_steps, self.optimizer)
        if args.fp16:
            self.scaler = torch.amp.GradScaler(args.device.type)
        if resume is not None:
            self._load_optimizer_and_scheduler(resume)
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        model = self.model_wrapped

        logger.info(
            "***** Running training *****  steps = %d, batch size per device = %d, accumulation = %d, world size = %d",
            max_steps,
            args.train_batch_size,
            gas,
            plugin.world_size,
        )
        start_time = time.time()
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._initial_global_step = self.state.global_step
        self._tr_loss = torch.tensor(0.0, device=args.device)
        self._total_loss_scalar = 0.0
        self._globalstep_last_logged = self.state.global_step
        plugin.zero_grad(model, self.optimizer)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self._evaluate(ignore_keys_for_eval)
        # A checkpoint already at max_steps has nothing left to train (transformers would still run one step).
        first_epoch = num_epochs if self.state.global_step >= max_steps else epochs_trained
        for epoch in range(first_epoch, num_epochs):
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            skip = steps_trained_in_epoch if (resume is not None and epoch == epochs_trained) else 0
            self._run_epoch(
                model,
                epoch,
                train_dataloader,
                steps_in_epoch,
                updates_per_epoch,
                ignore_keys_for_eval,
                start_time,
                resume if epoch == epochs_trained else None,
                skip,
            )
            if self.control.should_training_stop:
                break
        return self._finalize_training(num_train_samples, start_time)

    def _run_epoch(
        self,
        model,
        epoch,
        dataloader,
        steps_in_epoch,
        updates_per_epoch,
        ignore_keys_for_eval,
        start_time,
        resume,
        skip,
    ) -> None:
        args, plugin, gas = self.args, self.parallelism, self.args.gradient_accumulation_steps
        step, grad_norm, learning_rate = skip - 1, None, None
        batch_sampler = dataloader.batch_sampler
        if isinstance(batch_sampler, SkipBatchSampler):
            batch_sampler.set_epoch(epoch)  # the shuffle is a function of (seed, epoch)
            batch_sampler.skip_batches = skip
        elif hasattr(dataloader.dataset, "set_epoch"):
            dataloader.dataset.set_epoch(epoch)
        if resume is not None and skip == 0:
            self._load_rng_state(resume)  # before the iterator draws its base seed, as in the uninterrupted run
        epoch_iterator = iter(dataloader)
        if not isinstance(batch_sampler, SkipBatchSampler):
            for _ in range(skip):  # an iterable dataset cannot seek: read and drop what was trained on
                next(epoch_iterator, None)
        if resume is not None and skip > 0:
            self._load_rng_state(resume)
        remainder = steps_in_epoch % gas or gas
        for update_step in range(skip // gas, updates_per_epoch):
            num_batches = gas if update_step != updates_per_epoch - 1 else remainder
            batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches)
            if not batch_samples:
                break
            self.current_gradient_accumulation_steps = len(batch_samples)
            for i, inputs in enumerate(batch_samples):
                step += 1
                last = i == len(batch_samples) - 1
                if i == 0:
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                with plugin.no_sync(model) if not last else contextlib.nullcontext():
                    tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
                if args.logging_nan_inf_filter and not torch.isfinite(tr_loss_step):
                    # a nan/inf loss is logged as the mean of the losses since the last log
                    self._tr_loss += self._tr_loss / (1 + self.state.global_step - self._globalstep_last_logged)
                else:
                    self._tr_loss += tr_loss_step
                self.current_flos += float(self.floating_point_ops(inputs))
                self._track_num_input_tokens(inputs)
                if not last:
                    self.control = self.callback_handler.on_substep_end(args, self.state, self.control)
                    continue
                grad_norm, learning_rate = self._optimizer_step(model)
                self.state.global_step += 1
                self.state.epoch = epoch + (step + 1) / steps_in_epoch
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                self._maybe_log_save_evaluate(
                    self._tr_loss, grad_norm, model, ignore_keys_for_eval, start_time, learning_rate
                )
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
        if step < 0:
            logger.warning(
                "The epoch iterator yielded no sample (an empty dataset?): stopping training at step %d",
                self.state.global_step,
            )
            self.control.should_training_stop = True
        self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
        self._maybe_log_save_evaluate(self._tr_loss, grad_norm, model, ignore_keys_for_eval, start_time, learning_rate)

    def _optimizer_step(self, model):
        """Unscale (fp16), clip, step, schedule, zero the gradients; returns (pre-clip grad norm, lr used)."""
        args, plugin, optimizer = self.args, self.parallelism, self.optimizer
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        grad_norm = plugin.clip_grad_norm_(model, args.max_grad_norm if args.max_grad_norm > 0 else float("inf"))
        self.control = self.callback_handler.on_pre_optimizer_step(args, self.state, self.control)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale  # the scale drops exactly when the step was skipped (inf/nan)
        else:
            stepped = plugin.optimizer_step(optimizer)
        if grad_norm is None:
            grad_norm = plugin.get_global_grad_norm()
        self.control = self.callback_handler.on_optimizer_step(args, self.state, self.control)
        learning_rate = self._get_learning_rate()
        if stepped:
            self.lr_scheduler.step()
        plugin.zero_grad(model, optimizer)
        return grad_norm, learning_rate

    def _track_num_input_tokens(self, inputs) -> None:
        mode = self.args.include_num_input_tokens_seen
        if mode == "no":
            return
        name = getattr(self.parallelism.unwrap_model(self.model), "main_input_name", "input_ids")
        if name not in inputs:
            logger.warning("include_num_input_tokens_seen: the batch has no %r to count", name)
            return
        if mode == "non_padding" and "attention_mask" in inputs:
            count = inputs["attention_mask"].sum()
        else:
            count = inputs[name].numel()
        count = torch.as_tensor(count, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += int(self.parallelism.all_reduce(count).item())

    def _agree_on_control(self) -> None:
        """Every rank takes the decisions any rank's callbacks took: they all log, evaluate, save and stop
        together (the collectives inside each need every rank)."""
        if self.parallelism.world_size <= 1:
            return
        c = self.control
        names = ["should_log", "should_evaluate", "should_save", "should_training_stop", "should_epoch_stop"]
        flags = torch.tensor([getattr(c, n) for n in names], dtype=torch.int32, device=self.args.device)
        self.parallelism.all_reduce(flags, op=dist.ReduceOp.MAX)
        for name, flag in zip(names, flags.tolist()):
            setattr(c, name, bool(flag))

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, ignore_keys_for_eval, start_time, learning_rate):
        self._agree_on_control()
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            world = self.parallelism.world_size
            tr_loss_scalar = self.parallelism.all_reduce(tr_loss.detach().clone()).item() / world  # mean of ranks
            tr_loss -= tr_loss
            logs = {"loss": tr_loss_scalar / (self.state.global_step - self._globalstep_last_logged)}
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm.item() if torch.is_tensor(grad_norm) else float(grad_norm)
            logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
            self._total_loss_scalar += tr_loss_scalar
            self._globalstep_last_logged = self.state.global_step
            self.store_flos()
            self.log(logs, start_time)
        if self.control.should_evaluate:
            # The main process's metrics decide the best model everywhere (callbacks may have edited them per rank).
            metrics = self.parallelism.broadcast_object(self._evaluate(ignore_keys_for_eval))
            is_new_best = self._determine_best_metric(metrics)
            if self.args.save_strategy == SaveStrategy.BEST:
                self.control.should_save = is_new_best
            self._agree_on_control()  # callbacks' on_evaluate (early stopping) saw the same broadcast metrics
        if self.control.should_save:
            self._save_checkpoint(model)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _evaluate(self, ignore_keys_for_eval=None) -> dict:
        return self.evaluate(ignore_keys=ignore_keys_for_eval)

    def _determine_best_metric(self, metrics: dict) -> bool:
        if self.args.metric_for_best_model is None:
            return False
        key = self.args.metric_for_best_model
        key = key if key.startswith("eval_") else f"eval_{key}"
        if key not in metrics:
            raise KeyError(
                f"metric_for_best_model={self.args.metric_for_best_model!r}: {key!r} is not among the "
                f"evaluation metrics {sorted(metrics)}"
            )
        value, best = metrics[key], self.state.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            self.state.best_metric = value
            if self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST):
                self.state.best_global_step = self.state.global_step
            return True
        return False

    def _finalize_training(self, num_train_samples: int, start_time: float) -> TrainOutput:
        world = self.parallelism.world_size
        self._total_loss_scalar += self.parallelism.all_reduce(self._tr_loss.detach().clone()).item() / world
        steps = self.state.global_step - self._initial_global_step
        train_loss = self._total_loss_scalar / max(steps, 0.001)
        metrics = speed_metrics(
            "train", start_time, num_samples=num_train_samples * steps / max(self.state.max_steps, 1), num_steps=steps
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self.log(metrics)
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None:
            self.parallelism.barrier()  # the main process has finished writing the best checkpoint
            self._load_best_model()
        if self.args.should_save and best is not None and self.args.save_total_limit == 1:
            for checkpoint in sort_checkpoints(self.args.output_dir):  # keep only the best, as transformers
                if not os.path.samefile(checkpoint, best):
                    shutil.rmtree(checkpoint, ignore_errors=True)
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        return TrainOutput(self.state.global_step, train_loss, metrics)
