"""DeepSpeed's JSON config, the subset ds-zero implements, with DeepSpeed's own key names.

Mirrors ``deepspeed/runtime/config.py`` (``DeepSpeedConfig``): the batch-size triangle
``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp_world_size``
is completed from any two of its sides, and every value is checked before any communication.
A bad value raises :class:`DeepSpeedConfigError` naming the key and what is allowed. An unknown key
is refused where DeepSpeed's pydantic models refuse it (``zero_optimization``, ``fp16``, ``bf16``) and
logged and ignored elsewhere, as DeepSpeed ignores it; ``"bfloat16"`` is read as ``"bf16"``.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ds_zero.config_utils import DeepSpeedConfigError, as_bool, as_float, as_int, config_err, split_keys
from ds_zero.runtime.zero.config import DeepSpeedZeroConfig, parse_zero_config

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError"]

_TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "zero_optimization", "activation_checkpointing",
    "pipeline", "aio", "allgather_size", "steps_per_print",
}
# DeepSpeed's other top-level options: accepted, logged, no effect here.
_TOP_IGNORED = {
    "wall_clock_breakdown", "zero_allow_untested_optimizer", "dump_state",
    "zero_force_ds_cpu_optimizer", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "amp",
    "communication_data_type", "seq_parallel_communication_data_type", "flops_profiler", "tensorboard", "wandb",
    "csv_monitor", "comet", "elasticity", "checkpoint", "data_efficiency", "data_types", "compile",
    "memory_breakdown", "sparse_attention", "autotuning", "comms_logger", "torch_autocast", "disable_allgather",
    "dataloader_drop_last", "gradient_allreduce_op", "use_data_before_expert_parallelism", "log_level",
    "monitor_config", "eigenvalue", "progressive_layer_drop", "curriculum_learning", "quantize_training",
    "weight_quantization", "compression_training", "hybrid_engine", "nebula", "disable_python_gc",
    "managed_gradient_accumulation", "check_overflow", "tensor_parallel", "sequence_parallel_size",
}
_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}
_OPTIMIZER_PARAMS = {
    "Adam": {"lr", "betas", "eps", "weight_decay", "amsgrad", "torch_adam", "adam_w_mode", "bias_correction"},
    "AdamW": {"lr", "betas", "eps", "weight_decay", "amsgrad", "torch_adam", "adam_w_mode", "bias_correction"},
    "SGD": {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
}
_SCHEDULER_PARAMS = {
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
    "WarmupDecayLR": {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                      "last_batch_iteration"},
    "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                       "last_batch_iteration"},
}
_FP16_KEYS = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "consecutive_hysteresis", "min_loss_scale"}
_FP16_IGNORED = {"fp16_master_weights_and_grads"}
_BF16_KEYS = {"enabled"}
_BF16_IGNORED = {"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                 "bf16_optimizer_states"}
# deepspeed/runtime/activation_checkpointing/config.py
_ACT_CKPT_KEYS = {"partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                  "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}
# deepspeed/runtime/config.py: get_pipeline_config
_PIPELINE_KEYS = {"stages", "partition", "seed_layers", "activation_checkpoint_interval", "pipe_partitioned",
                  "grad_partitioned"}
# deepspeed/runtime/swap_tensor/aio_config.py
_AIO_KEYS = {"block_size", "queue_depth", "intra_op_parallelism", "thread_count", "use_gds"}
_AIO_IGNORED = {"single_submit", "overlap_events"}  # libaio submission details with no counterpart here


@dataclass
class ActivationCheckpointingConfig:
    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


@dataclass
class AioConfig:
    block_size: int = 1_048_576
    queue_depth: int = 8
    intra_op_parallelism: int = 1
    use_gds: bool = False


@dataclass
class FP16Config:
    enabled: bool = False
    loss_scale: float = 0.0  # 0 means dynamic, as in DeepSpeed
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0


@dataclass
class DeepSpeedConfig:
    """A validated config. ``world_size`` is the data-parallel world the batch triangle is solved for."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float = 1.0  # DeepSpeed's GRADIENT_CLIPPING_DEFAULT (0.19)
    optimizer_name: str | None = None
    optimizer_params: dict = field(default_factory=dict)
    scheduler_name: str | None = None
    scheduler_params: dict = field(default_factory=dict)
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16_enabled: bool = False
    zero: DeepSpeedZeroConfig = field(default_factory=DeepSpeedZeroConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(default_factory=ActivationCheckpointingConfig)
    pipeline: dict = field(default_factory=dict)
    aio: AioConfig = field(default_factory=AioConfig)
    steps_per_print: int | None = None  # DeepSpeed's default: no progress lines
    raw: dict = field(default_factory=dict)

    @property
    def zero_optimization_stage(self) -> int:
        return self.zero.stage

    @classmethod
    def load(cls, config: dict | str | os.PathLike, world_size: int) -> DeepSpeedConfig:
        if isinstance(config, (str, os.PathLike)):
            if not os.path.isfile(config):
                raise DeepSpeedConfigError(f"config file {str(config)!r} does not exist")
            with open(config) as f:
                config = json.load(f)
        if not isinstance(config, dict):
            raise DeepSpeedConfigError(f"config must be a dict or a JSON file path, got {type(config).__name__}")
        raw = copy.deepcopy(config)
        known = split_keys("", raw, _TOP_KEYS, _TOP_IGNORED)
        train, micro, gas = _batch_triangle(known, world_size)
        out = cls(train, micro, gas, raw=raw)
        if known.get("steps_per_print") is not None:
            out.steps_per_print = as_int("steps_per_print", known["steps_per_print"])
        if "gradient_clipping" in known:
            out.gradient_clipping = as_float("gradient_clipping", known["gradient_clipping"])
        if "optimizer" in known:
            out.optimizer_name, out.optimizer_params = _optimizer(known["optimizer"])
        if "scheduler" in known:
            out.scheduler_name, out.scheduler_params = _scheduler(known["scheduler"])
        out.fp16 = _fp16(known.get("fp16", {}))
        # DeepSpeed's get_bfloat16_config: "bf16", else the older "bfloat16" (ignored when both are given)
        bf16_key = "bf16" if "bf16" in known or "bfloat16" not in known else "bfloat16"
        bf16 = split_keys(bf16_key, known.get(bf16_key, {}), _BF16_KEYS, _BF16_IGNORED, strict=True)
        out.bf16_enabled = as_bool(f"{bf16_key}.enabled", bf16.get("enabled", False))
        if out.fp16.enabled and out.bf16_enabled:
            raise DeepSpeedConfigError(
                "config keys 'fp16.enabled' and 'bf16.enabled' are both true; enable at most one")
        out.zero = parse_zero_config(known.get("zero_optimization", {}), known.get("allgather_size", 500_000_000))
        out.activation_checkpointing = parse_activation_checkpointing(known.get("activation_checkpointing", {}))
        out.pipeline = _pipeline(known.get("pipeline", {}))
        out.aio = _aio(known.get("aio", {}))
        return out


def _batch_triangle(raw: dict, world_size: int) -> tuple[int, int, int]:
    train = raw.get("train_batch_size")
    micro = raw.get("train_micro_batch_size_per_gpu")
    gas = raw.get("gradient_accumulation_steps")
    train = None if train is None else as_int("train_batch_size", train)
    micro = None if micro is None else as_int("train_micro_batch_size_per_gpu", micro)
    gas = None if gas is None else as_int("gradient_accumulation_steps", gas)
    if train is not None and micro is not None and gas is not None:
        pass
    elif train is not None and micro is not None:
        gas, rem = divmod(train, micro * world_size)
        if rem or gas == 0:
            raise DeepSpeedConfigError(
                f"train_batch_size={train} is not divisible by train_micro_batch_size_per_gpu={micro} * "
                f"world_size={world_size}")
    elif train is not None and gas is not None:
        micro, rem = divmod(train, gas * world_size)
        if rem or micro == 0:
            raise DeepSpeedConfigError(
                f"train_batch_size={train} is not divisible by gradient_accumulation_steps={gas} * "
                f"world_size={world_size}")
    elif micro is not None:
        gas = gas or 1
        train = micro * gas * world_size
    elif train is not None:
        gas = 1
        micro, rem = divmod(train, world_size)
        if rem or micro == 0:
            raise DeepSpeedConfigError(f"train_batch_size={train} is not divisible by world_size={world_size}")
    else:
        raise DeepSpeedConfigError(
            "config needs at least one of 'train_batch_size' and 'train_micro_batch_size_per_gpu'")
    if train != micro * gas * world_size:
        raise DeepSpeedConfigError(
            f"check batch related parameters: train_batch_size={train} is not equal to "
            f"train_micro_batch_size_per_gpu={micro} * gradient_accumulation_steps={gas} * world_size={world_size}")
    return train, micro, gas


def _optimizer(section: Any) -> tuple[str, dict]:
    split_keys("optimizer", section, {"type", "params"})
    kind = section.get("type")
    if not isinstance(kind, str) or kind.lower() not in _OPTIMIZERS:
        raise config_err("optimizer.type", kind, str(sorted(_OPTIMIZERS.values())))
    name = _OPTIMIZERS[kind.lower()]
    params = split_keys("optimizer.params", section.get("params", {}), _OPTIMIZER_PARAMS[name])
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if key in params:
            as_float(f"optimizer.params.{key}", params[key])
    if "betas" in params:
        b = params["betas"]
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1
                                                                    for x in b)):
            raise config_err("optimizer.params.betas", b, "a list of two numbers in [0, 1)")
    for key in ("amsgrad", "torch_adam", "adam_w_mode", "nesterov"):
        if key in params:
            as_bool(f"optimizer.params.{key}", params[key])
    return name, dict(params)


def _scheduler(section: Any) -> tuple[str, dict]:
    split_keys("scheduler", section, {"type", "params"})
    kind = section.get("type")
    if kind not in _SCHEDULER_PARAMS:
        raise config_err("scheduler.type", kind, str(sorted(_SCHEDULER_PARAMS)))
    params = split_keys("scheduler.params", section.get("params", {}), _SCHEDULER_PARAMS[kind])
    if "warmup_type" in params and params["warmup_type"] not in ("log", "linear"):
        raise config_err("scheduler.params.warmup_type", params["warmup_type"], "['linear', 'log']")
    if "warmup_num_steps" in params:
        as_int("scheduler.params.warmup_num_steps", params["warmup_num_steps"])
    if "total_num_steps" in params:
        as_int("scheduler.params.total_num_steps", params["total_num_steps"])
    elif kind != "WarmupLR":
        raise DeepSpeedConfigError(f"config key 'scheduler.params.total_num_steps' is required by {kind}")
    return kind, dict(params)


def _fp16(section: Any) -> FP16Config:
    split_keys("fp16", section, _FP16_KEYS, _FP16_IGNORED, strict=True)
    out = FP16Config()
    out.enabled = as_bool("fp16.enabled", section.get("enabled", False))
    if section.get("auto_cast", False):
        raise config_err("fp16.auto_cast", section["auto_cast"], "false (inputs are cast by the caller)")
    out.loss_scale = as_float("fp16.loss_scale", section.get("loss_scale", 0.0))
    out.initial_scale_power = as_int("fp16.initial_scale_power", section.get("initial_scale_power", 16), 0)
    out.loss_scale_window = as_int("fp16.loss_scale_window", section.get("loss_scale_window", 1000))
    out.hysteresis = as_int("fp16.hysteresis", section.get("hysteresis", 2))
    out.consecutive_hysteresis = as_bool("fp16.consecutive_hysteresis", section.get("consecutive_hysteresis", False))
    out.min_loss_scale = as_float("fp16.min_loss_scale", section.get("min_loss_scale", 1.0))
    return out


def parse_activation_checkpointing(section: Any) -> ActivationCheckpointingConfig:
    section = split_keys("activation_checkpointing", section, _ACT_CKPT_KEYS)
    out = ActivationCheckpointingConfig()
    for key in ("partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                "synchronize_checkpoint_boundary", "profile"):
        if key in section:
            setattr(out, key, as_bool(f"activation_checkpointing.{key}", section[key]))
    if section.get("number_checkpoints") is not None:
        out.number_checkpoints = as_int("activation_checkpointing.number_checkpoints", section["number_checkpoints"])
    if out.contiguous_memory_optimization and out.number_checkpoints is None:
        raise config_err("activation_checkpointing.number_checkpoints", None,
                   "an integer >= 1 when contiguous_memory_optimization is true")
    return out


def _pipeline(section: Any) -> dict:
    section = split_keys("pipeline", section, _PIPELINE_KEYS)
    out = {"stages": "auto", "partition": "best", "seed_layers": False, "activation_checkpoint_interval": 0,
           "pipe_partitioned": True, "grad_partitioned": True}
    out.update(section)
    if out["stages"] != "auto":
        as_int("pipeline.stages", out["stages"])
    as_int("pipeline.activation_checkpoint_interval", out["activation_checkpoint_interval"], 0)
    for key in ("seed_layers", "pipe_partitioned", "grad_partitioned"):
        as_bool(f"pipeline.{key}", out[key])
    return out


def _aio(section: Any) -> AioConfig:
    section = split_keys("aio", section, _AIO_KEYS, _AIO_IGNORED)
    out = AioConfig()
    for key in ("block_size", "queue_depth"):
        if key in section:
            setattr(out, key, as_int(f"aio.{key}", section[key]))
    for key in ("intra_op_parallelism", "thread_count"):  # DeepSpeed renamed thread_count
        if key in section:
            out.intra_op_parallelism = as_int(f"aio.{key}", section[key])
    if section.get("use_gds", False):
        raise config_err("aio.use_gds", section["use_gds"], "false (GPUDirect Storage is not supported by ds_zero)")
    if out.block_size % 4096:
        raise config_err("aio.block_size", out.block_size, "a multiple of 4096 (O_DIRECT alignment)")
    return out
