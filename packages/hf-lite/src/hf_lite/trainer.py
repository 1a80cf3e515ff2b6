"""``Trainer`` (transformers' ``trainer.py``): set-up, data loaders, optimizer and schedule, and one micro-step. The
loop is in ``trainer_loop.py``, checkpoints in ``trainer_checkpoint.py``, evaluation in ``trainer_evaluation.py``
(mixins of this class), data-parallel engines behind ``trainer_distributed.py``'s plugin.

One optimizer step takes ``gradient_accumulation_steps`` micro-batches, fetched together first so the loss can be
normalised by the number of label tokens of the whole accumulated batch (on all ranks), as transformers 5 does: the
model sums its token losses and divides by that count, so 4 micro-batches of 1 give the gradient of 1 batch of 4."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from functools import partial

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from .data.data_collator import DataCollatorWithPadding, default_data_collator
from .integrations.integration_utils import get_reporting_integration_callbacks
from .loss_utils import ForCausalLMLoss
from .modeling_utils import PreTrainedModel
from .optimization import get_decay_parameter_names, get_scheduler
from .trainer_callback import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerControl,
    TrainerState,
)
from .trainer_checkpoint import TrainerCheckpointMixin
from .trainer_distributed import TorchDDPPlugin, destroy_distributed, init_distributed
from .trainer_evaluation import TrainerEvaluationMixin
from .trainer_loop import TrainerLoopMixin
from .trainer_metrics import TrainerMetricsMixin
from .trainer_pt_utils import IterableDatasetShard, SkipBatchSampler
from .trainer_utils import (
    OptimizerNames,
    has_length,
    seed_worker,
    set_seed,
    speed_metrics,
)
from .training_args import TrainingArguments

logger = logging.getLogger(__name__)


class Trainer(TrainerLoopMixin, TrainerCheckpointMixin, TrainerEvaluationMixin, TrainerMetricsMixin):
    """Train, evaluate and save a model with the arguments of ``TrainingArguments``.

    ``parallelism`` (hf-lite's addition) is a ``DataParallelPlugin``: how the model and optimizer are wrapped and
    stepped on several ranks. The default is torch's DDP over the default process group."""

    def __init__(
        self,
        model=None,
        args: TrainingArguments | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        preprocess_logits_for_metrics=None,
        parallelism=None,
    ):
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a TrainingArguments, got {type(args).__name__}")
        if model is None:
            raise ValueError("Trainer requires a `model`")
        self.args = args
        set_seed(args.seed)
        self._owns_process_group = init_distributed(args)
        if args.get_process_log_level() >= 0:
            logging.getLogger("hf_lite").setLevel(args.get_process_log_level())
        self.parallelism = parallelism if parallelism is not None else TorchDDPPlugin()
        model.to(args.device)
        self.model = self.model_wrapped = model
        forward = inspect.signature(model.forward).parameters
        self.model_accepts_loss_kwargs = getattr(model, "accepts_loss_kwargs", None)
        if self.model_accepts_loss_kwargs is None:
            self.model_accepts_loss_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in forward.values())
        self.label_names = args.label_names if args.label_names is not None else [n for n in forward if "label" in n]
        # Causal-LM losses predict token t+1 at t: position 0 of each row is never a target (transformers 5).
        self._loss_shifts_labels = isinstance(model, PreTrainedModel) and model.loss_function is ForCausalLMLoss
        if data_collator is None:
            data_collator = (
                DataCollatorWithPadding(processing_class) if hasattr(processing_class, "pad") else default_data_collator
            )
        self.data_collator = data_collator
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.processing_class = processing_class
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        if self.optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizers[0] must be a torch.optim.Optimizer, got {type(self.optimizer).__name__}")
        self._created_lr_scheduler = False
        self.scaler = None
        self._validate_args()
        callbacks = [DefaultFlowCallback, *get_reporting_integration_callbacks(args.report_to), *(callbacks or [])]
        self.callback_handler = CallbackHandler(callbacks, model, processing_class, self.optimizer, self.lr_scheduler)
        self.add_callback(PrinterCallback if args.disable_tqdm else ProgressCallback)
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
        self.control = TrainerControl()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero()
        )
        self.is_in_train = False
        self.current_flos = 0
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        if getattr(model, "config", None) is not None:
            model.config.use_cache = args.use_cache

    def _validate_args(self) -> None:
        args = self.args
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value!r} but no eval_dataset was passed to the "
                "Trainer: pass one or set eval_strategy='no'"
            )
        if args.load_best_model_at_end and self.eval_dataset is None:
            raise ValueError("load_best_model_at_end=True needs an eval_dataset")
        if self.train_dataset is not None and not has_length(self.train_dataset) and args.max_steps <= 0:
            raise ValueError("The train_dataset has no length (an IterableDataset): set max_steps to a positive value")
        if args.fp16 and args.device.type == "cpu" and not hasattr(torch.amp, "GradScaler"):
            raise ValueError("fp16=True on CPU needs torch.amp.GradScaler (torch >= 2.3)")

    # ------------------------------------------------------------------ callbacks and process roles
    def add_callback(self, callback) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback) -> None:
        self.callback_handler.remove_callback(callback)

    def is_local_process_zero(self) -> bool:
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        return self.args.process_index == 0

    # ------------------------------------------------------------------ data
    def _signature_columns(self) -> set[str] | None:
        params = inspect.signature(self.parallelism.unwrap_model(self.model).forward).parameters
        return set(params) | set(self.label_names) | {"label", "label_ids"}

    def _collator(self):
        if not self.args.remove_unused_columns:
            return self.data_collator
        keep, collator = self._signature_columns(), self.data_collator

        def remove_columns_collator(features):  # transformers' RemoveColumnsCollator
            if features and isinstance(features[0], dict):
                features = [{k: v for k, v in f.items() if k in keep} for f in features]
            return collator(features)

        return remove_columns_collator

    def _loader_kwargs(self) -> dict:
        args = self.args
        kwargs = {
            "collate_fn": self._collator(),
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory and args.device.type == "cuda",
        }
        if args.dataloader_num_workers > 0:
            kwargs.update(
                persistent_workers=args.dataloader_persistent_workers, prefetch_factor=args.dataloader_prefetch_factor
            )
        return kwargs

    def get_train_dataloader(self) -> DataLoader:
        """Map-style data: a ``DistributedSampler`` shuffling with ``data_seed`` (or ``seed``) + epoch on every world
        size, which on one process is the order transformers' seeded sampler gives; iterable data: sharded by rank."""
        args, dataset = self.args, self.train_dataset
        if dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        world, rank = self.parallelism.world_size, self.parallelism.process_index
        kwargs = self._loader_kwargs()
        if isinstance(dataset, IterableDataset):
            if world > 1:
                dataset = IterableDatasetShard(dataset, args.train_batch_size, args.dataloader_drop_last, world, rank)
            return DataLoader(dataset, batch_size=args.train_batch_size, **kwargs)
        seed = args.data_seed if args.data_seed is not None else args.seed
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
        batches = SkipBatchSampler(sampler, args.train_batch_size, args.dataloader_drop_last)
        return DataLoader(
            dataset,
            batch_sampler=batches,
            worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=rank),
            **kwargs,
        )

    def _eval_loader(self, dataset) -> tuple[DataLoader, int]:
        args, world, rank = self.args, self.parallelism.world_size, self.parallelism.process_index
        kwargs = self._loader_kwargs()
        if isinstance(dataset, IterableDataset):
            if world > 1:
                dataset = IterableDatasetShard(dataset, args.eval_batch_size, False, world, rank)
            return DataLoader(dataset, batch_size=args.eval_batch_size, **kwargs), 0
        indices = list(range(len(dataset)))
        batches = [indices[i : i + args.eval_batch_size] for i in range(0, len(indices), args.eval_batch_size)]
        if args.dataloader_drop_last and len(batches) > 1 and len(batches[-1]) < args.eval_batch_size:
            batches.pop()  # transformers drops the short last batch of evaluation loaders too
        padded = (-len(batches)) % world  # every rank makes the same number of steps (they gather each one)
        batches += [batches[i % len(batches)] for i in range(padded)]
        return DataLoader(dataset, batch_sampler=batches[rank::world], **kwargs), padded

    def get_eval_dataloader(self, eval_dataset=None) -> tuple[DataLoader, int]:
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        return self._eval_loader(eval_dataset if eval_dataset is not None else self.eval_dataset)

    def get_test_dataloader(self, test_dataset) -> tuple[DataLoader, int]:
        return self._eval_loader(test_dataset)

    # ------------------------------------------------------------------ optimizer and schedule
    def get_decay_parameter_names(self, model) -> list[str]:
        return get_decay_parameter_names(model)

    def create_optimizer(self):
        """AdamW over two groups: weight decay on the decay parameters, none on biases and norms."""
        if self.optimizer is None:
            model, args = self.model, self.args
            decay = set(self.get_decay_parameter_names(model))
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            groups = [
                {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
            ]
            kwargs = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
            if args.optim == OptimizerNames.ADAMW_TORCH_FUSED:
                kwargs["fused"] = True
            self.optimizer = torch.optim.AdamW(groups, **kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer or self.optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _get_learning_rate(self) -> float:
        lr = self.lr_scheduler.get_last_lr()[0]
        return lr.item() if torch.is_tensor(lr) else lr

    # ------------------------------------------------------------------ one step (the loop: trainer_loop.py)
    def get_batch_samples(self, epoch_iterator, num_batches: int):
        """Up to ``num_batches`` batches, and the number of label tokens they hold on all ranks together."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        return batches, self._get_num_items_in_batch(batches)

    def _get_num_items_in_batch(self, batches, distributed: bool = True):
        if not batches or "labels" not in batches[0]:
            return None
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            return None
        count = sum(
            (
                b["shift_labels"]
                if "shift_labels" in b
                else b["labels"][..., 1:]
                if self._loss_shifts_labels
                else b["labels"]
            )
            .ne(-100)
            .sum()
            for b in batches
        ).to(self.args.device)
        if distributed and self.args.average_tokens_across_devices and self.parallelism.world_size > 1:
            self.parallelism.all_reduce(count)
        return count

    def _prepare_inputs(self, inputs):
        def move(data):
            if isinstance(data, dict):
                return type(data)({k: move(v) for k, v in data.items()})
            if isinstance(data, (list, tuple)):
                return type(data)(move(v) for v in data)
            return data.to(self.args.device) if torch.is_tensor(data) else data

        if len(inputs) == 0:
            raise ValueError("The batch received was empty: does the dataset hold keys model.forward accepts?")
        return move(inputs)

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
        scaled_for_accumulation = (
            self.model_accepts_loss_kwargs and num_items_in_batch is not None
        ) or self.compute_loss_func is not None
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
                raise ValueError(
                    f"The model did not return a loss from the inputs, only {list(outputs)}; the "
                    f"inputs were {list(inputs)} (no labels?)"
                )
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
        world = self.parallelism.world_size
        if (
            model.training  # evaluation normalises per batch and combines the ranks itself
            and self.args.average_tokens_across_devices
            and num_items_in_batch is not None
            and world > 1
            and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
        ):
            loss = loss * world  # the count covers all ranks and the gradient reduction averages over them
        return (loss, outputs) if return_outputs else loss

    def floating_point_ops(self, inputs) -> int:
        """6 x tokens x non-embedding parameters when the model can count its parameters (``num_parameters``), else
        0: a plain ``nn.Module`` counts no FLOPs (transformers 5.24's ``Trainer.floating_point_ops``)."""
        model = self.parallelism.unwrap_model(self.model)
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0
        # the parameter count (a walk over every module) taken once per model
        if getattr(self, "_flops_model", None) is not model:
            self._flops_model, self._flops_params = model, model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self._flops_params

    def store_flos(self) -> None:
        flos = torch.tensor(float(self.current_flos), dtype=torch.float64, device=self.args.device)
        self.state.total_flos += self.parallelism.all_reduce(flos).item()
        self.current_flos = 0

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

    def end(self) -> None:
        """Call once at the very end of a script: destroys the process group the Trainer created under torchrun
        (after a barrier); train/evaluate/predict/save_model communicate and fail after it (transformers 5.24)."""
        if self._owns_process_group:
            destroy_distributed()
            self._owns_process_group = False

    # ------------------------------------------------------------------ saving
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A Hugging Face directory (config.json, model.safetensors, tokenizer files when a ``processing_class`` is
        given) that ``from_pretrained`` of hf-lite and transformers loads; written by the main process.
        ``_internal_call`` is transformers' signature: there it only decides hub pushes, which hf-lite has not."""
        state_dict = self.parallelism.model_state_dict(self.model_wrapped)  # every rank: a plugin may gather
        self._save(output_dir if output_dir is not None else self.args.output_dir, state_dict=state_dict)
        self.parallelism.barrier()
