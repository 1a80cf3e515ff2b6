"""DeepSpeed's JSON config as the engine consumes it (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py`` and ``offload_config.py``), one spelling per key.

The batch-size triangle ``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps *
dp_world_size`` is completed from any two of its sides, and every value is checked before any communication: a
bad value raises :class:`DeepSpeedConfigError` naming the key and what is allowed. DeepSpeed's other spellings,
legacy forms and the options ds_zero does not implement are converted or dropped before this parser sees them
(:mod:`ds_zero._compat.config`).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from ds_zero.runtime.config_utils import DeepSpeedConfigError, as_bool, as_float, as_int, config_err, split_keys

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "DeepSpeedZeroConfig", "DeepSpeedZeroOffloadConfig"]

OFFLOAD_DEVICES = ["none", "cpu", "nvme"]


@dataclass
class DeepSpeedZeroOffloadConfig:
    """``offload_optimizer`` / ``offload_param`` (DeepSpeed's ``DeepSpeedZeroOffload{Optimizer,Param}Config``)."""

    device: str = "none"
    nvme_path: str | None = None
    pin_memory: bool = True
    buffer_count: int = 4
    buffer_size: int = 100_000_000
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @property
    def pipeline(self) -> bool:
        return self.pipeline_read or self.pipeline_write


_OFFLOAD_OPTIMIZER_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "pipeline_read", "pipeline_write",
                           "fast_init"}
_OFFLOAD_PARAM_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size"}


def _offload(key: str, section: Any, param: bool) -> DeepSpeedZeroOffloadConfig:
    if section is None:
        return DeepSpeedZeroOffloadConfig()
    section = split_keys(key, section, _OFFLOAD_PARAM_KEYS if param else _OFFLOAD_OPTIMIZER_KEYS, strict=True)
    out = DeepSpeedZeroOffloadConfig(buffer_count=5 if param else 4)
    out.device = section.get("device", "none")
    if out.device not in OFFLOAD_DEVICES:
        raise config_err(f"{key}.device", out.device, str(OFFLOAD_DEVICES))
    if section.get("nvme_path") is not None:
        if not isinstance(section["nvme_path"], (str, os.PathLike)):
            raise config_err(f"{key}.nvme_path", section["nvme_path"], "a directory path")
        out.nvme_path = os.fspath(section["nvme_path"])
    for name in ("pin_memory", "pipeline_read", "pipeline_write", "fast_init"):
        if name in section:
            setattr(out, name, as_bool(f"{key}.{name}", section[name]))
    for name in ("buffer_count", "buffer_size"):
        if name in section:
            setattr(out, name, as_int(f"{key}.{name}", section[name], 0))
    if out.device == "nvme":
        if out.nvme_path is None:
            raise config_err(f"{key}.nvme_path", None, "a directory path (required when device is 'nvme')")
        if out.buffer_count < 2:
            raise config_err(f"{key}.buffer_count", out.buffer_count, "an integer >= 2 (double buffering)")
        check_nvme_path(f"{key}.nvme_path", out.nvme_path)
    return out


def check_nvme_path(key: str, path: str, need_bytes: int = 0) -> None:
    """Fail at start-up, not mid-training: the directory must be creatable, writable and have room."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise config_err(key, path, f"a creatable directory ({e.strerror})") from e
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise config_err(key, path, "a writable directory")
    if need_bytes:
        free = shutil.disk_usage(path).free
        if free < need_bytes:
            raise DeepSpeedConfigError(
                f"config key {key!r}: {path!r} has {free / 2**20:.1f} MiB free, the swapped tensors need "
                f"{need_bytes / 2**20:.1f} MiB")


# key -> (attribute, minimum)
_ZERO_INT_KEYS = {
    "reduce_bucket_size": ("reduce_bucket_size", 1),
    "allgather_bucket_size": ("allgather_bucket_size", 1),
    "sub_group_size": ("sub_group_size", 1),
    "stage3_prefetch_bucket_size": ("prefetch_bucket_size", 0),
    "stage3_param_persistence_threshold": ("param_persistence_threshold", 0),
    "stage3_max_live_parameters": ("max_live_parameters", 0),
    "stage3_max_reuse_distance": ("max_reuse_distance", 0),
}
_ZERO_BOOL_KEYS = {"overlap_comm", "contiguous_gradients", "reduce_scatter"}


@dataclass
class DeepSpeedZeroConfig:
    stage: int = 0
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    sub_group_size: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    offload_optimizer: DeepSpeedZeroOffloadConfig = field(default_factory=DeepSpeedZeroOffloadConfig)
    offload_param: DeepSpeedZeroOffloadConfig = field(default_factory=DeepSpeedZeroOffloadConfig)

    @classmethod
    def from_dict(cls, section: Any) -> DeepSpeedZeroConfig:
        key = "zero_optimization"
        allowed = {"stage", "offload_optimizer", "offload_param"} | _ZERO_BOOL_KEYS | set(_ZERO_INT_KEYS)
        section = split_keys(key, section, allowed, strict=True)
        out = cls()
        stage = section.get("stage", 0)
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise config_err(f"{key}.stage", stage, "[0, 1, 2, 3]")
        out.stage = stage
        out.overlap_comm = stage == 3  # DeepSpeed's default when the key is absent
        for name in _ZERO_BOOL_KEYS & set(section):
            setattr(out, name, as_bool(f"{key}.{name}", section[name]))
        for name, (attr, minimum) in _ZERO_INT_KEYS.items():
            if name in section:
                setattr(out, attr, as_int(f"{key}.{name}", section[name], minimum))
        out.offload_optimizer = _offload(f"{key}.offload_optimizer", section.get("offload_optimizer"), param=False)
        out.offload_param = _offload(f"{key}.offload_param", section.get("offload_param"), param=True)
        if out.offload_optimizer.enabled and stage == 0:
            raise config_err(f"{key}.offload_optimizer.device", out.offload_optimizer.device,
                             "'none' unless zero_optimization.stage is 1, 2 or 3")
        if out.offload_optimizer.device == "nvme" and stage != 3:
            raise config_err(f"{key}.offload_optimizer.device", "nvme", "'none' or 'cpu' unless zero_optimization."
                                                                        "stage is 3 (ZeRO-Infinity swaps stage 3's "
                                                                        "partitions)")
        if out.offload_param.enabled and stage != 3:
            raise config_err(f"{key}.offload_param.device", out.offload_param.device,
                             "'none' unless zero_optimization.stage is 3")
        return out


@dataclass
class ActivationCheckpointingConfig:
    """``activation_checkpointing`` (``deepspeed/runtime/activation_checkpointing/config.py``)."""

    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: int | None = None


def parse_activation_checkpointing(section: Any) -> ActivationCheckpointingConfig:
    section = split_keys("activation_checkpointing", section, {"partition_activations", "cpu_checkpointing",
                                                               "contiguous_memory_optimization", "number_checkpoints"})
    out = ActivationCheckpointingConfig()
    for key in ("partition_activations", "contiguous_memory_optimization", "cpu_checkpointing"):
        if key in section:
            setattr(out, key, as_bool(f"activation_checkpointing.{key}", section[key]))
    if section.get("number_checkpoints") is not None:
        out.number_checkpoints = as_int("activation_checkpointing.number_checkpoints", section["number_checkpoints"])
    if out.contiguous_memory_optimization and out.number_checkpoints is None:
        raise config_err("activation_checkpointing.number_checkpoints", None,
                         "an integer >= 1 when contiguous_memory_optimization is true")
    return out


@dataclass
class AioConfig:
    """``aio`` (``deepspeed/runtime/swap_tensor/aio_config.py``): how ZeRO-Infinity reads and writes swap files."""

    block_size: int = 1_048_576
    queue_depth: int = 8
    intra_op_parallelism: int = 1


def _aio(section: Any) -> AioConfig:
    section = split_keys("aio", section, {"block_size", "queue_depth", "intra_op_parallelism"})
    out = AioConfig(**{key: as_int(f"aio.{key}", value) for key, value in section.items()})
    if out.block_size % 4096:
        raise config_err("aio.block_size", out.block_size, "a multiple of 4096 (O_DIRECT alignment)")
    return out


@dataclass
class FP16Config:
    enabled: bool = False
    loss_scale: float = 0.0  # 0 means dynamic, as in DeepSpeed
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0


_FP16_KEYS = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "consecutive_hysteresis", "min_loss_scale"}


def _fp16(section: Any) -> FP16Config:
    section = split_keys("fp16", section, _FP16_KEYS, strict=True)
    return FP16Config(
        enabled=as_bool("fp16.enabled", section.get("enabled", False)),
        loss_scale=as_float("fp16.loss_scale", section.get("loss_scale", 0.0)),
        initial_scale_power=as_int("fp16.initial_scale_power", section.get("initial_scale_power", 16), 0),
        loss_scale_window=as_int("fp16.loss_scale_window", section.get("loss_scale_window", 1000)),
        hysteresis=as_int("fp16.hysteresis", section.get("hysteresis", 2)),
        consecutive_hysteresis=as_bool("fp16.consecutive_hysteresis", section.get("consecutive_hysteresis", False)),
        min_loss_scale=as_float("fp16.min_loss_scale", section.get("min_loss_scale", 1.0)))


_TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "steps_per_print", "fp16", "bf16", "zero_optimization", "activation_checkpointing", "pipeline", "aio",
}


def read_config(config: dict | str | os.PathLike) -> dict:
    """A config dict, or the JSON file a path names."""
    if isinstance(config, (str, os.PathLike)):
        if not os.path.isfile(config):
            raise DeepSpeedConfigError(f"config file {str(config)!r} does not exist")
        with open(config) as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise DeepSpeedConfigError(f"config must be a dict or a JSON file path, got {type(config).__name__}")
    return config


@dataclass
class DeepSpeedConfig:
    """A validated config. ``world_size`` is the data-parallel world the batch triangle is solved for;
    ``activation_checkpointing`` is None when the section is absent (the engine then leaves it unconfigured)."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float = 1.0  # DeepSpeed's GRADIENT_CLIPPING_DEFAULT (0.19)
    steps_per_print: int | None = None  # DeepSpeed's default: no progress lines
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16_enabled: bool = False
    zero: DeepSpeedZeroConfig = field(default_factory=DeepSpeedZeroConfig)
    activation_checkpointing: ActivationCheckpointingConfig | None = None
    pipeline_activation_checkpoint_interval: int = 0
    aio: AioConfig = field(default_factory=AioConfig)
    raw: dict = field(default_factory=dict)  # the config as given, saved with checkpoints

    @classmethod
    def load(cls, config: dict | str | os.PathLike, world_size: int) -> DeepSpeedConfig:
        raw = copy.deepcopy(read_config(config))
        known = split_keys("", raw, _TOP_KEYS)
        out = cls(*_batch_triangle(known, world_size), raw=raw)
        if known.get("steps_per_print") is not None:
            out.steps_per_print = as_int("steps_per_print", known["steps_per_print"])
        if "gradient_clipping" in known:
            out.gradient_clipping = as_float("gradient_clipping", known["gradient_clipping"])
        out.fp16 = _fp16(known.get("fp16", {}))
        bf16 = split_keys("bf16", known.get("bf16", {}), {"enabled"}, strict=True)
        out.bf16_enabled = as_bool("bf16.enabled", bf16.get("enabled", False))
        if out.fp16.enabled and out.bf16_enabled:
            raise DeepSpeedConfigError("config keys 'fp16.enabled' and 'bf16.enabled' are both true; enable at most "
                                       "one")
        out.zero = DeepSpeedZeroConfig.from_dict(known.get("zero_optimization", {}))
        if "activation_checkpointing" in known:
            out.activation_checkpointing = parse_activation_checkpointing(known["activation_checkpointing"])
        pipeline = split_keys("pipeline", known.get("pipeline", {}), {"activation_checkpoint_interval"})
        out.pipeline_activation_checkpoint_interval = as_int(
            "pipeline.activation_checkpoint_interval", pipeline.get("activation_checkpoint_interval", 0), 0)
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
