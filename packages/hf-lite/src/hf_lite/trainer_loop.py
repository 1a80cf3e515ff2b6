"""The Trainer's loop (transformers' ``trainer.py``), top to bottom: ``train`` -> ``_inner_training_loop`` -> one epoch
of optimizer steps -> ``training_step`` -> ``compute_loss``, then ``_maybe_log_save_evaluate``. Three concepts it calls
live beside it, each bound here as methods of the same names (so a subclass may override them): the batches
(``trainer_data.py``), the evaluation loop (``trainer_evaluation.py``) and the checkpoints (``trainer_checkpoint.py``).

One optimizer step takes ``gradient_accumulation_steps`` micro-batches, fetched together first so the loss can be
normalised by the number of label tokens of the whole accumulated batch (on all ranks), as transformers 5 does: the
model sums its token losses and divides by that count, so 4 micro-batches of 1 give the gradient of 1 batch of 4.

What happens on several ranks goes through ``self.parallelism`` (``trainer_distributed.DataParallelPlugin``): wrapping,
backward, clipping, the optimizer step, and the collectives that keep ranks in agreement. When to log, evaluate, save
and stop is decided by the callbacks (``trainer_events.py``; ``DefaultFlowCallback`` reads the strategies). ``args``
holds the fields of ``TrainingArguments`` (``_compat/training_args.py``). The public ``hf_lite.Trainer``
(``_compat/trainer.py``) is this class with transformers' defaults (torchrun and DDP, the default collator, progress
bars, ``report_to``) and the methods scripts call after training (``log_metrics``, ``save_metrics``, ...); it overrides
no step of the loop.

A checkpoint ``checkpoint-N/`` holds the model as a Hugging Face directory and, beside it, optimizer, scheduler, grad
scaler, per-rank RNG states and trainer_state.json. Resuming restores all of it, then skips the batches already
trained on in that epoch at the sampler level: the data order is a function of (seed, epoch), so the resumed run sees
exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import math
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from . import trainer_checkpoint, trainer_data, trainer_evaluation
from ._infra.atomic_io import atomic_write_text
from .loss_utils import ForCausalLMLoss
from .modeling_utils import PreTrainedModel
from .optimization import get_decay_parameter_names, get_scheduler
from .trainer_checkpoint import load_model_weights, load_optimizer_and_scheduler, load_rng_state, load_trainer_state
from .trainer_distributed import DataParallelPlugin
from .trainer_events import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState
from .trainer_pt_utils import (
    SkipBatchSampler,
    nested_map,
)
from .trainer_utils import (
    TRAINING_ARGS_NAME,
    EvalLoopOutput,
    OptimizerNames,
    SaveStrategy,
    TrainOutput,
    get_last_checkpoint,
    has_length,
    set_seed,
    sort_checkpoints,
    speed_metrics,
)

logger = logging.getLogger(__name__)


class Trainer:
    """Train, evaluate and save ``model`` with the fields of ``args``; ``parallelism`` is a ``DataParallelPlugin``
    (one process, no wrapping, when None); ``data_collator`` defaults to torch's ``default_collate``."""

    def __init__(self, model, args, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 compute_loss_func=None, compute_metrics=None, callbacks=None, optimizers=(None, None),
                 preprocess_logits_for_metrics=None, parallelism=None):
        self.args = args
        set_seed(args.seed)
        self.parallelism = parallelism if parallelism is not None else DataParallelPlugin()
        model.to(args.device)
        self.model = self.model_wrapped = model
        forward = inspect.signature(model.forward).parameters
        self.model_accepts_loss_kwargs = getattr(model, "accepts_loss_kwargs", None)
        if self.model_accepts_loss_kwargs is None:
            self.model_accepts_loss_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in forward.values())
        self.label_names = args.label_names if args.label_names is not None else [n for n in forward if "label" in n]
        # Causal-LM losses predict token t+1 at t: position 0 of each row is never a target (transformers 5).
        self._loss_shifts_labels = isinstance(model, PreTrainedModel) and model.loss_function is ForCausalLMLoss
        self.data_collator = data_collator if data_collator is not None else default_collate
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.processing_class = processing_class
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        if self.optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizers[0] must be a torch.optim.Optimizer, got {type(self.optimizer).__name__}")
        self._created_lr_scheduler, self.scaler = False, None
        self.callback_handler = CallbackHandler([DefaultFlowCallback, *(callbacks or [])], model, processing_class,
                                                self.optimizer, self.lr_scheduler)
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
        self.control = TrainerControl()
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        self.is_in_train, self.current_flos = False, 0
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        if getattr(model, "config", None) is not None:
            model.config.use_cache = args.use_cache

    def is_local_process_zero(self) -> bool:
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        return self.args.process_index == 0

    # ------------------------------------------------------------------ data (trainer_data.py)
    get_train_dataloader = trainer_data.get_train_dataloader
    get_eval_dataloader = trainer_data.get_eval_dataloader
    _eval_loader = trainer_data.eval_loader

    # ------------------------------------------------------------------ optimizer and schedule
    def get_decay_parameter_names(self, model) -> list[str]:
        return get_decay_parameter_names(model)

    def create_optimizer(self):
        """AdamW over two groups: weight decay on the decay parameters, none on biases and norms."""
        if self.optimizer is None:
            model, args = self.model, self.args
            decay = set(self.get_decay_parameter_names(model))
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
                      {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
            kwargs = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
            if args.optim == OptimizerNames.ADAMW_TORCH_FUSED:
                kwargs["fused"] = True
            self.optimizer = torch.optim.AdamW(groups, **kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            args = self.args
            self.lr_scheduler = get_scheduler(args.lr_scheduler_type, optimizer or self.optimizer,
                                              num_warmup_steps=args.get_warmup_steps(num_training_steps),
                                              num_training_steps=num_training_steps,
                                              scheduler_specific_kwargs=args.lr_scheduler_kwargs)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _get_learning_rate(self) -> float:
        lr = self.lr_scheduler.get_last_lr()[0]
        return lr.item() if torch.is_tensor(lr) else lr

    # ------------------------------------------------------------------ train
    def train(self, resume_from_checkpoint: str | bool | None = None, ignore_keys_for_eval=None) -> TrainOutput:
        """Train; ``resume_from_checkpoint`` is a checkpoint directory, or True for the newest complete one in
        ``output_dir``. None falls back to ``args.resume_from_checkpoint`` (transformers leaves that to scripts)."""
        args = self.args
        resume = args.resume_from_checkpoint if resume_from_checkpoint is None else resume_from_checkpoint
        resume = None if resume is False else resume
        if resume is True:
            resume = get_last_checkpoint(args.output_dir)
            if resume is None:
                raise ValueError(f"No valid checkpoint found in output directory ({args.output_dir})")
        if resume is not None and not os.path.isdir(resume):
            raise ValueError(f"resume_from_checkpoint={resume!r} is not a directory")
        self.is_in_train = True
        try:
            if args.gradient_checkpointing:
                kwargs = args.gradient_checkpointing_kwargs
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            if resume is not None:
                load_model_weights(self.model, resume)
            return self._inner_training_loop(resume, ignore_keys_for_eval)
        finally:
            self.is_in_train = False

    def _inner_training_loop(self, resume, ignore_keys_for_eval) -> TrainOutput:
        args, plugin = self.args, self.parallelism
        train_dataloader = self.get_train_dataloader()
        gas = args.gradient_accumulation_steps
        if has_length(train_dataloader):
            steps_in_epoch = len(train_dataloader)
            updates_per_epoch = max(math.ceil(steps_in_epoch / gas), 1)
            if args.max_steps > 0:
                max_steps, num_epochs = args.max_steps, math.ceil(args.max_steps / updates_per_epoch)
                # As transformers: the schedule's samples when step-bound, the dataset's when epoch-bound.
                num_train_samples = max_steps * args.train_batch_size * gas * plugin.world_size
            else:
                max_steps = math.ceil(args.num_train_epochs * updates_per_epoch)
                num_epochs = math.ceil(args.num_train_epochs)
                num_train_samples = int(len(train_dataloader.dataset) * args.num_train_epochs)
        else:  # an iterable dataset: epochs until max_steps (each epoch re-iterates it)
            max_steps, num_epochs, updates_per_epoch = args.max_steps, sys.maxsize, args.max_steps
            steps_in_epoch = max_steps * gas
            num_train_samples = max_steps * args.train_batch_size * gas * plugin.world_size

        self.state = TrainerState(stateful_callbacks=trainer_checkpoint.stateful_callbacks(self),
                                  train_batch_size=args.train_batch_size)
        self.state.compute_steps(args, max_steps)
        epochs_trained, steps_trained_in_epoch = 0, 0
        if resume is not None:
            self.state = load_trainer_state(resume)
            trainer_checkpoint.load_callback_state(self)
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
            load_optimizer_and_scheduler(resume, args, plugin, self.optimizer, self.lr_scheduler, self.scaler)
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        model = self.model_wrapped

        logger.info("***** Running training *****  steps = %d, batch size per device = %d, accumulation = %d, "
                    "world size = %d", max_steps, args.train_batch_size, gas, plugin.world_size)
        start_time = time.time()
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._initial_global_step = self.state.global_step
        self._tr_loss = torch.tensor(0.0, device=args.device)
        self._total_loss_scalar = 0.0
        self._globalstep_last_logged = self.state.global_step
        plugin.zero_grad(model, self.optimizer)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self.evaluate(ignore_keys=ignore_keys_for_eval)
        # A checkpoint already at max_steps has nothing left to train (transformers would still run one step).
        first_epoch = num_epochs if self.state.global_step >= max_steps else epochs_trained
        for epoch in range(first_epoch, num_epochs):
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            skip = steps_trained_in_epoch if (resume is not None and epoch == epochs_trained) else 0
            self._run_epoch(model, epoch, train_dataloader, steps_in_epoch, updates_per_epoch, ignore_keys_for_eval,
                            start_time, resume if epoch == epochs_trained else None, skip)
            if self.control.should_training_stop:
                break
        return self._finalize_training(num_train_samples, start_time)

    def _run_epoch(self, model, epoch, dataloader, steps_in_epoch, updates_per_epoch, ignore_keys_for_eval,
                   start_time, resume, skip) -> None:
        args, plugin, gas = self.args, self.parallelism, self.args.gradient_accumulation_steps
        step, grad_norm, learning_rate = skip - 1, None, None
        batch_sampler = dataloader.batch_sampler
        if isinstance(batch_sampler, SkipBatchSampler):
            batch_sampler.set_epoch(epoch)  # the shuffle is a function of (seed, epoch)
            batch_sampler.skip_batches = skip
        elif hasattr(dataloader.dataset, "set_epoch"):
            dataloader.dataset.set_epoch(epoch)
        if resume is not None and skip == 0:
            load_rng_state(resume, args)  # before the iterator draws its base seed, as in the uninterrupted run
        epoch_iterator = iter(dataloader)
        if not isinstance(batch_sampler, SkipBatchSampler):
            for _ in range(skip):  # an iterable dataset cannot seek: read and drop what was trained on
                next(epoch_iterator, None)
        if resume is not None and skip > 0:
            load_rng_state(resume, args)
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
                self._maybe_log_save_evaluate(self._tr_loss, grad_norm, model, ignore_keys_for_eval, start_time,
                                              learning_rate)
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
        if step < 0:
            logger.warning("The epoch iterator yielded no sample (an empty dataset?): stopping training at step %d",
                           self.state.global_step)
            self.control.should_training_stop = True
        self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
        self._maybe_log_save_evaluate(self._tr_loss, grad_norm, model, ignore_keys_for_eval, start_time, learning_rate)

    def get_batch_samples(self, epoch_iterator, num_batches: int):
        """Up to ``num_batches`` batches, and the number of label tokens they hold on all ranks together."""
        batches = list(itertools.islice(epoch_iterator, num_batches))
        return batches, self._get_num_items_in_batch(batches)

    def _get_num_items_in_batch(self, batches, distributed: bool = True):
        if not batches or "labels" not in batches[0]:
            return None
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            return None

        def targets(b):
            if "shift_labels" in b:
                return b["shift_labels"]
            return b["labels"][..., 1:] if self._loss_shifts_labels else b["labels"]

        count = sum(targets(b).ne(-100).sum() for b in batches).to(self.args.device)
        if distributed and self.args.average_tokens_across_devices and self.parallelism.world_size > 1:
            self.parallelism.all_reduce(count)
        return count

    def _prepare_inputs(self, inputs):
        if len(inputs) == 0:
            raise ValueError("The batch received was empty: does the dataset hold keys model.forward accepts?")
        return nested_map(lambda t: t.to(self.args.device), inputs)

    def compute_loss_context_manager(self):
        if self.args.bf16 or self.args.fp16:
            dtype = torch.bfloat16 if self.args.bf16 else torch.float16
            return torch.autocast(device_type=self.args.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        if not model.training:  # train() walks every module; only after an evaluation is it needed
            model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        scaled_for_accumulation = (self.model_accepts_loss_kwargs
                                   and num_items_in_batch is not None) or self.compute_loss_func is not None
        if not scaled_for_accumulation:  # a per-batch mean: average the accumulated micro-batches
            loss = loss / self.current_gradient_accumulation_steps
        self.parallelism.backward(self.scaler.scale(loss) if self.scaler is not None else loss, model)
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        labels = inputs.pop("labels") if self.compute_loss_func is not None and "labels" in inputs else None
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        else:
            if isinstance(outputs, dict) and "loss" not in outputs:
                raise ValueError(f"The model did not return a loss from the inputs, only {list(outputs)}; the "
                                 f"inputs were {list(inputs)} (no labels?)")
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
        if (
            model.training  # evaluation normalises per batch and combines the ranks itself
            and self.args.average_tokens_across_devices
            and num_items_in_batch is not None
            and self.parallelism.world_size > 1
            and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
        ):
            loss = loss * self.parallelism.world_size  # the count covers all ranks; the reduction averages them
        return (loss, outputs) if return_outputs else loss

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

    def floating_point_ops(self, inputs) -> int:
        """6 x tokens x non-embedding parameters when the model can count its parameters (``num_parameters``), else
        0: a plain ``nn.Module`` counts no FLOPs (transformers 5.24's ``Trainer.floating_point_ops``)."""
        model = self.parallelism.unwrap_model(self.model)
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0
        if getattr(self, "_flops_model", None) is not model:  # the parameter count walks every module: once
            self._flops_model, self._flops_params = model, model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self._flops_params

    def store_flos(self) -> None:
        flos = torch.tensor(float(self.current_flos), dtype=torch.float64, device=self.args.device)
        self.state.total_flos += self.parallelism.all_reduce(flos).item()
        self.current_flos = 0

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
        names = ["should_log", "should_evaluate", "should_save", "should_training_stop", "should_epoch_stop"]
        flags = torch.tensor([getattr(self.control, n) for n in names], dtype=torch.int32, device=self.args.device)
        self.parallelism.all_reduce(flags, op=dist.ReduceOp.MAX)
        for name, flag in zip(names, flags.tolist()):
            setattr(self.control, name, bool(flag))

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
            metrics = self.parallelism.broadcast_object(self.evaluate(ignore_keys=ignore_keys_for_eval))
            is_new_best = self._determine_best_metric(metrics)
            if self.args.save_strategy == SaveStrategy.BEST:
                self.control.should_save = is_new_best
            self._agree_on_control()  # callbacks' on_evaluate (early stopping) saw the same broadcast metrics
        if self.control.should_save:
            self._save_checkpoint(model)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _determine_best_metric(self, metrics: dict) -> bool:
        if self.args.metric_for_best_model is None:
            return False
        key = self.args.metric_for_best_model
        key = key if key.startswith("eval_") else f"eval_{key}"
        if key not in metrics:
            raise KeyError(f"metric_for_best_model={self.args.metric_for_best_model!r}: {key!r} is not among the "
                           f"evaluation metrics {sorted(metrics)}")
        value, best = metrics[key], self.state.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            self.state.best_metric = value
            if self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST):
                self.state.best_global_step = self.state.global_step
            return True
        return False

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                seen = self.state.num_input_tokens_seen - self._initial_num_input_tokens_seen
                logs.update(speed_metrics("train", start_time, num_tokens=seen))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs=logs)

    def _finalize_training(self, num_train_samples: int, start_time: float) -> TrainOutput:
        world = self.parallelism.world_size
        self._total_loss_scalar += self.parallelism.all_reduce(self._tr_loss.detach().clone()).item() / world
        steps = self.state.global_step - self._initial_global_step
        train_loss = self._total_loss_scalar / max(steps, 0.001)
        samples = num_train_samples * steps / max(self.state.max_steps, 1)
        metrics = speed_metrics("train", start_time, num_samples=samples, num_steps=steps)
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

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Loss (and ``compute_metrics``) on ``eval_dataset`` (a dataset, a name in a dict of eval datasets, or the
        Trainer's); logs the metrics and calls ``on_evaluate``."""
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(eval_dataset, dict):
            metrics = {}
            for name, dataset in eval_dataset.items():
                metrics.update(self.evaluate(dataset, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        metrics = self._run_evaluation(self.get_eval_dataloader(eval_dataset), "Evaluation", ignore_keys,
                                       metric_key_prefix, True if self.compute_metrics is None else None).metrics
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def _run_evaluation(self, loader_and_padding, description, ignore_keys, metric_key_prefix,
                        prediction_loss_only=None) -> EvalLoopOutput:
        """``evaluation_loop`` with speed metrics; the main process's metrics for everyone (timings differ by rank,
        decisions must not)."""
        start = time.time()
        output = self.evaluation_loop(*loader_and_padding, description, prediction_loss_only, ignore_keys,
                                      metric_key_prefix)
        num_steps = math.ceil(output.num_samples / (self.args.eval_batch_size * self.args.world_size))
        output.metrics.update(speed_metrics(metric_key_prefix, start, num_samples=output.num_samples,
                                            num_steps=num_steps))
        return output._replace(metrics=self.parallelism.broadcast_object(output.metrics))

    evaluation_loop = trainer_evaluation.evaluation_loop  # (trainer_evaluation.py)
    prediction_step = trainer_evaluation.prediction_step

    # ------------------------------------------------------------------ save
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A Hugging Face directory (config.json, model.safetensors, tokenizer files when a ``processing_class`` is
        given) that ``from_pretrained`` of hf-lite and transformers loads; written by the main process.
        ``_internal_call``: a call of the Trainer's own, which never pushes to the hub (``_compat/trainer.py``)."""
        state_dict = self.parallelism.model_state_dict(self.model_wrapped)  # every rank: a plugin may gather
        self._save(output_dir if output_dir is not None else self.args.output_dir, state_dict=state_dict)
        self.parallelism.barrier()

    def _save(self, output_dir: str, state_dict=None) -> None:
        """The model as a Hugging Face directory (+ tokenizer files, + training_args.json), main process only."""
        if not self.args.should_save:
            return
        model = self.parallelism.unwrap_model(self.model)
        if state_dict is None:
            state_dict = self.parallelism.model_state_dict(self.model_wrapped)
        if isinstance(model, PreTrainedModel):
            model.save_pretrained(output_dir, state_dict=state_dict)
        else:
            from safetensors.torch import save_file

            logger.info("Trainer.model is not a PreTrainedModel: saving its state dict only")
            os.makedirs(output_dir, exist_ok=True)
            save_file({k: v.contiguous() for k, v in state_dict.items()}, os.path.join(output_dir, "model.safetensors"),
                      metadata={"format": "pt"})
        tokenizer = self.processing_class
        if tokenizer is None:
            tokenizer = getattr(self.data_collator, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save_pretrained(output_dir)
        atomic_write_text(os.path.join(output_dir, TRAINING_ARGS_NAME), self.args.to_json_string() + "\n")

    # ------------------------------------------------------------------ checkpoints (trainer_checkpoint.py)
    _save_checkpoint = trainer_checkpoint.save_checkpoint
    _load_best_model = trainer_checkpoint.load_best_model
