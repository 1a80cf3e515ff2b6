"""``TrainingArguments``: transformers' field names and defaults; invalid values and combinations raise here, at
construction, naming the fields (transformers' ``training_args.py``).

No ``from __future__ import annotations`` here: ``HfArgumentParser`` reads the fields' real types."""

import contextlib
import dataclasses
import importlib.util
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..trainer_utils import ExplicitEnum, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType
from .torch_ddp import init_distributed

logger = logging.getLogger(__name__)

LOG_LEVELS = {"passive": -1, "debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
REPORT_TO = ("tensorboard", "jsonl")


# What hf-lite lacks behind each of these transformers fields; any value but the default raises naming it.
_UNSUPPORTED = {
    "label_smoothing_factor": "the loss is the model's own cross-entropy",
    "optim_args": "optim is adamw_torch(_fused), which takes no extra arguments",
    "optim_target_modules": "there are no GaLore/APOLLO optimizers",
    "bf16_full_eval": "evaluation runs in the training precision",
    "fp16_full_eval": "evaluation runs in the training precision",
    "torch_compile": "the model is not compiled",
    "torch_compile_backend": "the model is not compiled",
    "torch_compile_mode": "the model is not compiled",
    "use_liger_kernel": "there are no Liger kernels",
    "liger_kernel_config": "there are no Liger kernels",
    "neftune_noise_alpha": "there is no NEFTune embedding noise",
    "auto_find_batch_size": "the batch size is fixed",
    "include_for_metrics": "compute_metrics gets predictions and labels only",
    "batch_eval_metrics": "compute_metrics runs once over the whole evaluation",
    "save_on_each_node": "the main process writes every checkpoint",
    "enable_jit_checkpoint": "there is no checkpoint-on-signal",
    "skip_memory_metrics": "there are no memory metrics",
    "dataloader_multiprocessing_context": "the data loader uses the platform's default context",
    "dataloader_in_order": "the data loader yields in order",
    "train_sampling_strategy": "the sampler is a seeded shuffle",
    "accelerator_config": "there is no accelerate",
    "parallelism_config": "another engine comes in through Trainer(parallelism=...)",
    "fsdp": "another engine comes in through Trainer(parallelism=...)",
    "fsdp_config": "another engine comes in through Trainer(parallelism=...)",
    "deepspeed": "another engine comes in through Trainer(parallelism=...)",
    "debug": "there are no debug options",
}


class HubStrategy(ExplicitEnum):
    """What the Trainer pushes at each save (transformers' ``trainer_utils.HubStrategy``)."""

    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class ParallelMode(ExplicitEnum):
    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"


def _is_tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


@dataclass
class TrainingArguments:
    """The knobs of ``Trainer``; see transformers' ``TrainingArguments`` for each field's meaning."""

    output_dir: str | None = field(default=None, metadata={"help": "Where checkpoints and the model are written."})
    # read by scripts (run_clm.py), not by the Trainer, as in transformers
    do_train: bool = field(default=False, metadata={"help": "Whether to run training."})
    do_eval: bool = field(default=False, metadata={"help": "Whether to run eval on the dev set."})
    do_predict: bool = field(default=False, metadata={"help": "Whether to run predictions on the test set."})
    push_to_hub: bool = field(default=False, metadata={"help": "Push the model and checkpoints to the hub."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per device for training."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Batch size per device for evaluation."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Total number of training epochs."})
    max_steps: int = field(default=-1, metadata={"help": "If > 0: total optimizer steps (overrides epochs)."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Initial learning rate (AdamW)."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "linear, cosine, constant, constant_with_warmup"}
    )
    lr_scheduler_kwargs: dict | str | None = field(default=None, metadata={"help": "Extra scheduler kwargs (JSON)."})
    warmup_steps: float = field(default=0, metadata={"help": "Warmup steps (int), or a ratio of all steps in [0, 1)."})
    warmup_ratio: float | None = field(default=None, metadata={"help": "transformers 4 name: warmup as a ratio."})
    optim: str = field(default="adamw_torch_fused", metadata={"help": "adamw_torch or adamw_torch_fused"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (never on biases and norms)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 disables clipping)."})
    average_tokens_across_devices: bool = field(default=True, metadata={"help": "Normalise by all ranks' tokens."})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast."})
    fp16: bool = field(default=False, metadata={"help": "float16 autocast with a gradient scaler."})
    gradient_checkpointing: bool | None = field(default=None, metadata={"help": "Recompute activations in backward."})
    gradient_checkpointing_kwargs: dict | str | None = field(default=None, metadata={"help": "torch checkpoint kwargs"})
    activation_checkpointing: bool | None = field(default=None, metadata={"help": "transformers 5.24's name."})
    activation_checkpointing_kwargs: dict | str | None = field(default=None, metadata={"help": "5.24's name."})
    use_cache: bool = field(default=False, metadata={"help": "config.use_cache while training."})
    logging_strategy: str = field(default="steps", metadata={"help": "no, steps, epoch"})
    logging_steps: float = field(default=500, metadata={"help": "Log every X steps (or a ratio in [0, 1))."})
    logging_first_step: bool = field(default=False, metadata={"help": "Log the first step too."})
    logging_nan_inf_filter: bool = field(default=True, metadata={"help": "Keep nan/inf losses out of the logs."})
    include_num_input_tokens_seen: str | bool = field(default="no", metadata={"help": "no, all, non_padding"})
    log_level: str = field(default="passive", metadata={"help": "Log level of the main process."})
    log_level_replica: str = field(default="warning", metadata={"help": "Log level of the other ranks."})
    disable_tqdm: bool | None = field(default=None, metadata={"help": "No progress bars (PrinterCallback instead)."})
    report_to: str | list[str] | None = field(default="none", metadata={"help": "none, all, tensorboard, jsonl"})
    run_name: str | None = field(default=None, metadata={"help": "A name for the run (TensorBoard's log dir)."})
    eval_strategy: str = field(default="no", metadata={"help": "no, steps, epoch"})
    eval_steps: float | None = field(default=None, metadata={"help": "Evaluate every X steps (default logging_steps)."})
    eval_delay: float = field(default=0, metadata={"help": "Steps or epochs before the first evaluation."})
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate before the first step."})
    prediction_loss_only: bool = field(default=False, metadata={"help": "Evaluate the loss only."})
    eval_do_concat_batches: bool = field(default=True, metadata={"help": "Predictions as one array (only True)."})
    save_strategy: str = field(default="steps", metadata={"help": "no, steps, epoch, best"})
    save_steps: float = field(default=500, metadata={"help": "Save every X steps (or a ratio in [0, 1))."})
    save_total_limit: int | None = field(default=None, metadata={"help": "Keep at most this many checkpoints."})
    save_only_model: bool = field(default=False, metadata={"help": "No optimizer/scheduler/RNG (cannot resume)."})
    load_best_model_at_end: bool = field(default=False, metadata={"help": "Load the best checkpoint at the end."})
    metric_for_best_model: str | None = field(default=None, metadata={"help": "Metric comparing checkpoints."})
    greater_is_better: bool | None = field(default=None, metadata={"help": "Whether a larger metric is better."})
    ignore_data_skip: bool = field(default=False, metadata={"help": "On resume, do not skip the batches seen."})
    restore_callback_states_from_checkpoint: bool = field(
        default=False,
        metadata={
            "help": "On resume, restore ExportableState callbacks (EarlyStoppingCallback counters)."
        },
    )
    seed: int = field(default=42, metadata={"help": "Random seed set at the start."})
    data_seed: int | None = field(default=None, metadata={"help": "Seed of the data order (default: seed)."})
    use_cpu: bool = field(default=False, metadata={"help": "Train on CPU even if CUDA is available."})
    dataloader_drop_last: bool = field(default=False, metadata={"help": "Drop the last incomplete batch."})
    dataloader_num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes."})
    dataloader_pin_memory: bool = field(default=True, metadata={"help": "Pin host memory."})
    dataloader_persistent_workers: bool = field(default=False, metadata={"help": "Keep workers between epochs."})
    dataloader_prefetch_factor: int | None = field(default=None, metadata={"help": "Batches prefetched per worker."})
    remove_unused_columns: bool = field(default=True, metadata={"help": "Drop keys model.forward does not take."})
    label_names: list[str] | None = field(default=None, metadata={"help": "Input keys holding the labels."})
    ddp_backend: str | None = field(default=None, metadata={"help": "gloo or nccl (default: nccl on CUDA)."})
    ddp_find_unused_parameters: bool | None = field(default=None, metadata={"help": "DDP find_unused_parameters."})
    ddp_timeout: int = field(default=1800, metadata={"help": "Process-group timeout in seconds."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "Checkpoint for train() to resume."})
    hub_token: str | None = field(default=None, metadata={"help": "The token to push to the hub with."})
    hub_private_repo: bool | None = field(default=None, metadata={"help": "Create the hub repo private."})
    hub_model_id: str | None = field(default=None, metadata={"help": "The repo to push to (default: output_dir)."})
    hub_strategy: str = field(default="every_save", metadata={"help": "end, every_save, checkpoint, all_checkpoints"})
    hub_always_push: bool = field(default=False, metadata={"help": "Push even while the last push is running."})
    hub_revision: str | None = field(default=None, metadata={"help": "The branch to push to."})
    # transformers' fields that change no result here: memory or process placement only
    eval_accumulation_steps: int | None = field(default=None, metadata={"help": "(memory only: hf-lite gathers on "
                                                                                "the host after every step)"})
    eval_use_gather_object: bool = field(default=False, metadata={"help": "(hf-lite always gathers objects)"})
    torch_empty_cache_steps: int | None = field(default=None, metadata={"help": "(memory only)"})
    local_rank: int = field(default=-1, metadata={"help": "(torchrun's LOCAL_RANK is read instead)"})
    log_on_each_node: bool = field(default=True, metadata={"help": "Log from each node's main process."})
    tf32: bool | None = field(default=None, metadata={"help": "Allow TF32 matmuls on Ampere+ GPUs."})
    full_determinism: bool = field(default=False, metadata={"help": "enable_full_determinism(seed) at start."})
    ddp_bucket_cap_mb: int | None = field(default=None, metadata={"help": "DDP bucket_cap_mb."})
    ddp_broadcast_buffers: bool | None = field(default=None, metadata={"help": "DDP broadcast_buffers."})
    ddp_static_graph: bool | None = field(default=None, metadata={"help": "DDP static_graph."})
    length_column_name: str = field(default="length", metadata={"help": "(read with group_by_length only)"})
    project: str = field(default="huggingface", metadata={"help": "(trackio's project; not an integration here)"})
    trackio_space_id: str | None = field(default=None, metadata={"help": "(trackio only)"})
    trackio_bucket_id: str | None = field(default=None, metadata={"help": "(trackio only)"})
    trackio_static_space_id: str | None = field(default=None, metadata={"help": "(trackio only)"})
    # transformers' fields hf-lite has only at their defaults (_UNSUPPORTED says why)
    label_smoothing_factor: float = field(default=0.0, metadata={"help": "0 only"})
    optim_args: str | None = field(default=None, metadata={"help": "None only"})
    optim_target_modules: str | None = field(default=None, metadata={"help": "None only"})
    bf16_full_eval: bool = field(default=False, metadata={"help": "False only"})
    fp16_full_eval: bool = field(default=False, metadata={"help": "False only"})
    torch_compile: bool = field(default=False, metadata={"help": "False only"})
    torch_compile_backend: str | None = field(default=None, metadata={"help": "None only"})
    torch_compile_mode: str | None = field(default=None, metadata={"help": "None only"})
    use_liger_kernel: bool = field(default=False, metadata={"help": "False only"})
    liger_kernel_config: dict | None = field(default=None, metadata={"help": "None only"})
    neftune_noise_alpha: float | None = field(default=None, metadata={"help": "None only"})
    auto_find_batch_size: bool = field(default=False, metadata={"help": "False only"})
    include_for_metrics: list[str] = field(default_factory=list, metadata={"help": "empty only"})
    batch_eval_metrics: bool = field(default=False, metadata={"help": "False only"})
    save_on_each_node: bool = field(default=False, metadata={"help": "False only"})
    enable_jit_checkpoint: bool = field(default=False, metadata={"help": "False only"})
    skip_memory_metrics: bool = field(default=True, metadata={"help": "True only"})
    dataloader_multiprocessing_context: str | None = field(default=None, metadata={"help": "None only"})
    dataloader_in_order: bool = field(default=True, metadata={"help": "True only"})
    train_sampling_strategy: str = field(default="random", metadata={"help": "random only"})
    accelerator_config: dict | str | None = field(default=None, metadata={"help": "None only"})
    parallelism_config: dict | None = field(default=None, metadata={"help": "None only"})
    fsdp: str | None = field(default=None, metadata={"help": "None only (Trainer(parallelism=...))"})
    fsdp_config: dict | str | None = field(default=None, metadata={"help": "None only"})
    deepspeed: dict | str | None = field(default=None, metadata={"help": "None only (Trainer(parallelism=...))"})
    debug: str = field(default="", metadata={"help": "empty only"})

    def check_supported(self) -> None:
        """Every field of ``_UNSUPPORTED`` at transformers' default (at construction, and again when a Trainer gets
        the arguments: the setters may have changed them)."""
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self) if f.name in _UNSUPPORTED}
        for name, default in defaults.items():
            if getattr(self, name) != default:
                raise ValueError(f"{name}={getattr(self, name)!r}: hf-lite supports only {default!r} "
                                 f"({_UNSUPPORTED[name]})")

    def __post_init__(self):
        self.check_supported()
        if self.tf32 is not None and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.tf32
        if not self.eval_do_concat_batches:
            raise ValueError("eval_do_concat_batches=False: hf-lite's evaluation loop concatenates the batches")
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        self.output_dir = os.path.expanduser(os.fspath(self.output_dir))
        for name in ("lr_scheduler_kwargs", "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{name}={value!r} is not a JSON object: {err}") from None
        self.lr_scheduler_kwargs = self.lr_scheduler_kwargs or {}
        # gradient_checkpointing* is the name of transformers <= 5.23; both names mirror the one that was set.
        for old, new in (
            ("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
        ):
            a, b = getattr(self, old), getattr(self, new)
            if a is not None and b is not None and a != b:
                raise ValueError(f"{old}={a!r} and {new}={b!r} disagree; set one of them")
            value = a if b is None else b
            setattr(self, old, value)
            setattr(self, new, value)
        self.gradient_checkpointing = self.activation_checkpointing = bool(self.gradient_checkpointing)
        if self.disable_tqdm is None:
            self.disable_tqdm = logger.getEffectiveLevel() > logging.WARNING
        if isinstance(self.include_num_input_tokens_seen, bool):
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"
        self.eval_strategy = IntervalStrategy(self.eval_strategy)
        self.logging_strategy = IntervalStrategy(self.logging_strategy)
        self.save_strategy = SaveStrategy(self.save_strategy)
        self.hub_strategy = HubStrategy(self.hub_strategy)
        self.lr_scheduler_type = SchedulerType(self.lr_scheduler_type)
        self.optim = OptimizerNames(self.optim)
        if self.eval_strategy == IntervalStrategy.STEPS and not self.eval_steps:
            if self.logging_steps <= 0:
                raise ValueError(
                    f"eval_strategy={self.eval_strategy.value!r} needs a positive eval_steps or logging_steps"
                )
            self.eval_steps = self.logging_steps
        if (
            self.load_best_model_at_end or self.save_strategy == SaveStrategy.BEST
        ) and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        self.report_to = self._resolve_report_to(self.report_to)
        self._validate()

    @staticmethod
    def _resolve_report_to(report_to) -> list[str]:
        if report_to is None:
            return []
        names = [report_to] if isinstance(report_to, str) else list(report_to)
        names = [n.strip() for name in names for n in name.split(",") if n.strip()]
        if names in (["none"], []):
            return []
        if names == ["all"]:
            return [n for n in REPORT_TO if n != "tensorboard" or _is_tensorboard_available()]
        unknown = [n for n in names if n not in REPORT_TO]
        if unknown:
            raise ValueError(
                f"report_to={report_to!r}: unknown integration(s) {unknown}; choose from {list(REPORT_TO)}"
                " or 'all' / 'none'"
            )
        if "tensorboard" in names and not _is_tensorboard_available():
            raise ValueError(
                "report_to includes 'tensorboard' but the tensorboard package is not installed "
                "(pip install tensorboard), or leave it out of report_to"
            )
        return names

    def _validate(self) -> None:
        positive_ints = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
        for name in positive_ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not isinstance(self.max_steps, int) or self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps={self.max_steps!r} must be a positive integer, or -1 to train by epochs")
        if self.max_steps < 0 and not self.num_train_epochs > 0:
            raise ValueError(f"num_train_epochs={self.num_train_epochs!r} must be positive when max_steps is -1")
        for name in ("learning_rate", "weight_decay", "max_grad_norm", "eval_delay"):
            if getattr(self, name) < 0 or not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a finite number >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        if not self.adam_epsilon > 0:
            raise ValueError(f"adam_epsilon={self.adam_epsilon!r} must be > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be >= 0 (steps, or a ratio in [0, 1))")
        if self.warmup_steps >= 1 and self.warmup_steps != int(self.warmup_steps):
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be an integer when >= 1")
        if self.warmup_ratio is not None:
            if not 0.0 <= self.warmup_ratio < 1.0:
                raise ValueError(f"warmup_ratio={self.warmup_ratio!r} must be in [0, 1)")
            if self.warmup_steps:
                raise ValueError(f"warmup_steps={self.warmup_steps!r} and warmup_ratio={self.warmup_ratio!r}: set one")
        for kind in ("logging", "eval", "save"):
            strategy = getattr(self, f"{kind}_strategy")
            steps = getattr(self, f"{kind}_steps")
            if strategy != "steps":
                continue
            if steps is None or steps <= 0:
                raise ValueError(f"{kind}_strategy='steps' requires a positive {kind}_steps, got {steps!r}")
            if steps > 1:
                if steps != int(steps):
                    raise ValueError(f"{kind}_steps={steps!r} must be an integer when bigger than 1")
                setattr(self, f"{kind}_steps", int(steps))
        if self.load_best_model_at_end and self.save_strategy != SaveStrategy.BEST:
            if self.eval_strategy != self.save_strategy:
                raise ValueError(
                    "load_best_model_at_end requires the save and eval strategy to match (or save_strategy='best'), "
                    f"but found eval_strategy={self.eval_strategy.value!r}, save_strategy={self.save_strategy.value!r}"
                )
            if self.eval_strategy == IntervalStrategy.STEPS and (self.save_steps * 10**6) % (self.eval_steps * 10**6):
                raise ValueError(
                    f"load_best_model_at_end requires save_steps={self.save_steps} to be a round multiple "
                    f"of eval_steps={self.eval_steps}"
                )
        if self.save_strategy == SaveStrategy.BEST and self.eval_strategy == IntervalStrategy.NO:
            raise ValueError("save_strategy='best' saves after evaluations, but eval_strategy='no'")
        if self.save_total_limit is not None and (
            not isinstance(self.save_total_limit, int) or self.save_total_limit < 1
        ):
            raise ValueError(f"save_total_limit={self.save_total_limit!r} must be None or a positive integer")
        if self.fp16 and self.bf16:
            raise ValueError("fp16=True and bf16=True: at most one of fp16 and bf16 can be True")
        if self.bf16 and self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("bf16=True but this CUDA device does not support bfloat16 (set use_cpu=True or fp16=True)")
        if self.include_num_input_tokens_seen not in ("no", "all", "non_padding"):
            raise ValueError(
                f"include_num_input_tokens_seen={self.include_num_input_tokens_seen!r} must be one of "
                "'no', 'all', 'non_padding' or a bool"
            )
        for name in ("log_level", "log_level_replica"):
            if getattr(self, name) not in LOG_LEVELS:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {list(LOG_LEVELS)}")
        if self.ddp_backend not in (None, "gloo", "nccl"):
            raise ValueError(f"ddp_backend={self.ddp_backend!r} must be None, 'gloo' or 'nccl'")
        if self.dataloader_num_workers < 0:
            raise ValueError(f"dataloader_num_workers={self.dataloader_num_workers!r} must be >= 0")
        if self.dataloader_num_workers == 0 and (
            self.dataloader_prefetch_factor is not None or self.dataloader_persistent_workers
        ):
            raise ValueError(
                "dataloader_prefetch_factor / dataloader_persistent_workers need dataloader_num_workers > 0"
            )
        if self.data_seed is not None and (not isinstance(self.data_seed, int) or self.data_seed < 0):
            raise ValueError(f"data_seed={self.data_seed!r} must be a non-negative integer")

    # ------------------------------------------------------------------ the process this runs in
    @property
    def world_size(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def process_index(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    @property
    def local_process_index(self) -> int:
        return int(os.environ.get("LOCAL_RANK", str(self.process_index if self.world_size > 1 else 0)))

    @property
    def device(self) -> torch.device:
        if self.use_cpu or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", self.local_process_index % torch.cuda.device_count())

    @property
    def n_gpu(self) -> int:  # transformers' DataParallel count; hf-lite runs one device per process
        return 1

    @property
    def parallel_mode(self) -> ParallelMode:
        """``distributed`` under torchrun (several ranks), else ``not_parallel``: one device per process."""
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """The main process (of the node with ``local``) runs the block first, the others after it, as
        transformers' ``main_process_first``: e.g. a dataset map whose cache the others then read. Initialises the
        process group under torchrun when nothing has yet."""
        if self.world_size <= 1:
            yield
            return
        init_distributed(self)
        is_main = (self.local_process_index if local else self.process_index) == 0
        try:
            if not is_main:
                logger.debug("%s: waiting for the main process to perform %s", self.process_index, desc)
                dist.barrier()
            yield
        finally:
            if is_main:
                logger.debug("%s: main process done with %s, releasing the others", self.process_index, desc)
                dist.barrier()

    @property
    def should_log(self) -> bool:
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        return self.process_index == 0

    @property
    def train_batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size

    def get_warmup_steps(self, num_training_steps: int) -> int:
        ratio = self.warmup_ratio if self.warmup_ratio is not None else self.warmup_steps
        return int(ratio) if ratio >= 1 else math.ceil(num_training_steps * ratio)

    def get_process_log_level(self) -> int:
        level = LOG_LEVELS[self.log_level if self.should_log else self.log_level_replica]
        return logging.getLogger("hf_lite").getEffectiveLevel() if level == -1 else level

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.value if hasattr(value, "value") and not isinstance(value, (int, float)) else value
            if f.name.endswith("_token"):
                out[f.name] = f"<{f.name.upper()}>"  # never written to disk (transformers' to_dict)
        return out

    def to_sanitized_dict(self) -> dict[str, Any]:
        """``to_dict`` with the batch sizes, values other than bool/int/float/str/tensor as strings (TensorBoard's
        hparams)."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str, torch.Tensor) else str(v) for k, v in d.items()}

    def set_push_to_hub(self, model_id: str, strategy: str | HubStrategy = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False, revision: str | None = None):
        """Turn on pushing to ``model_id`` with these hub settings; returns ``self``."""
        self.push_to_hub, self.hub_model_id, self.hub_strategy = True, model_id, HubStrategy(strategy)
        self.hub_token, self.hub_private_repo, self.hub_always_push = token, private_repo, always_push
        self.hub_revision = revision
        return self

    # transformers' grouped setters: each sets its fields and returns ``self``
    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1, seed: int = 42,
                     activation_checkpointing: bool = False, gradient_checkpointing: bool | None = None):
        self.do_train, self.learning_rate, self.per_device_train_batch_size = True, learning_rate, batch_size
        self.weight_decay, self.num_train_epochs, self.max_steps = weight_decay, num_epochs, max_steps
        self.gradient_accumulation_steps, self.seed = gradient_accumulation_steps, seed
        checkpointing = activation_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        self.activation_checkpointing = self.gradient_checkpointing = checkpointing
        return self

    def _strategy(self, kind, strategy, steps):
        strategy = kind(strategy)
        if strategy.value == "steps" and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        return strategy

    def set_evaluate(self, strategy: str | IntervalStrategy = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None, loss_only: bool = False):
        self.eval_strategy = self._strategy(IntervalStrategy, strategy, steps)
        self.do_eval, self.eval_steps = self.eval_strategy != IntervalStrategy.NO, steps
        self.per_device_eval_batch_size, self.eval_accumulation_steps = batch_size, accumulation_steps
        self.eval_delay, self.prediction_loss_only = delay, loss_only
        return self

    def set_testing(self, batch_size: int = 8, loss_only: bool = False):
        self.do_predict, self.per_device_eval_batch_size, self.prediction_loss_only = True, batch_size, loss_only
        return self

    def set_save(self, strategy: str | SaveStrategy = "steps", steps: int = 500, total_limit: int | None = None,
                 on_each_node: bool = False):
        self.save_strategy = self._strategy(SaveStrategy, strategy, steps)
        self.save_steps, self.save_total_limit, self.save_on_each_node = steps, total_limit, on_each_node
        return self

    def set_logging(self, strategy: str | IntervalStrategy = "steps", steps: int = 500,
                    report_to: str | list[str] = "none", level: str = "passive", first_step: bool = False,
                    nan_inf_filter: bool = False, on_each_node: bool = False, replica_level: str = "passive"):
        self.logging_strategy = self._strategy(IntervalStrategy, strategy, steps)
        self.logging_steps, self.report_to, self.log_level = steps, report_to, level
        self.logging_first_step, self.logging_nan_inf_filter = first_step, nan_inf_filter
        self.log_on_each_node, self.log_level_replica = on_each_node, replica_level
        return self

    def set_optimizer(self, name: str | OptimizerNames = "adamw_torch", learning_rate: float = 5e-5,
                      weight_decay: float = 0, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                      args: str | None = None):
        self.optim, self.learning_rate, self.weight_decay = OptimizerNames(name), learning_rate, weight_decay
        self.adam_beta1, self.adam_beta2, self.adam_epsilon, self.optim_args = beta1, beta2, epsilon, args
        return self

    def set_lr_scheduler(self, name: str | SchedulerType = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0):
        self.lr_scheduler_type, self.num_train_epochs = SchedulerType(name), num_epochs
        self.max_steps, self.warmup_steps = max_steps, warmup_steps
        return self

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, multiprocessing_context: str | None = None,
                       in_order: bool = True, auto_find_batch_size: bool = False, ignore_data_skip: bool = False,
                       sampler_seed: int | None = None):
        self.per_device_train_batch_size, self.per_device_eval_batch_size = train_batch_size, eval_batch_size
        self.dataloader_drop_last, self.dataloader_num_workers = drop_last, num_workers
        self.dataloader_pin_memory, self.dataloader_persistent_workers = pin_memory, persistent_workers
        self.dataloader_prefetch_factor = prefetch_factor
        self.dataloader_multiprocessing_context, self.dataloader_in_order = multiprocessing_context, in_order
        self.auto_find_batch_size, self.ignore_data_skip = auto_find_batch_size, ignore_data_skip
        self.data_seed = sampler_seed
        return self

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
