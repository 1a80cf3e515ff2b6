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
    push_to_hub: bool = field(default=False, metadata={"help": "Upload to the hub (hf-lite: False only)."})
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

    def __post_init__(self):
        if self.push_to_hub:
            raise ValueError("push_to_hub=True: hf-lite has no hub; save_model() writes a local directory")
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
        return self.local_process_index == 0

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
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
