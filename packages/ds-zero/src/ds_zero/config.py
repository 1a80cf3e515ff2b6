"""DeepSpeed's JSON config, the subset ds-zero implements, with DeepSpeed's own key names.

Mirrors ``deepspeed/runtime/config.py`` (``DeepSpeedConfig``): the batch-size triangle
``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp_world_size``
is completed from any two of its sides, and every key is checked before any communication.
An unknown key or a bad value raises :class:`DeepSpeedConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any


class DeepSpeedConfigError(ValueError):
    """A config key is unknown or its value is not allowed."""


_TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "fp16", "bf16", "zero_optimization",
    # Accepted for compatibility with DeepSpeed configs; they change nothing here.
    "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "dump_state",
}
_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}
_OPTIMIZER_PARAMS = {
    "Adam": {"lr", "betas", "eps", "weight_decay", "amsgrad", "torch_adam", "adam_w_mode"},
    "AdamW": {"lr", "betas", "eps", "weight_decay", "amsgrad", "torch_adam", "adam_w_mode"},
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
_BF16_KEYS = {"enabled"}
_ZERO_KEYS = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
              "allgather_partitions", "allgather_bucket_size", "stage3_prefetch_bucket_size",
              "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "offload_optimizer", "offload_param"}
_OFFLOAD_KEYS = {"device", "pin_memory"}
_OFFLOAD_DEVICES = ["none", "cpu"]


def _err(key: str, value: Any, allowed: str) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(f"config key {key!r} has invalid value {value!r}; allowed: {allowed}")


def _check_keys(section: str, d: Any, allowed: set) -> dict:
    if not isinstance(d, dict):
        raise _err(section, d, "a JSON object")
    unknown = sorted(set(d) - allowed)
    if unknown:
        where = f"in {section!r}" if section else "at the top level"
        raise DeepSpeedConfigError(f"unknown config key {unknown[0]!r} {where}; allowed keys: {sorted(allowed)}")
    return d


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _err(key, v, "true or false")
    return v


def _pos_int(key: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        raise _err(key, v, f"an integer >= {minimum}")
    return int(v)


def _nonneg_float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise _err(key, v, "a number >= 0")
    return float(v)


@dataclass
class ZeroConfig:
    stage: int = 0
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_live_parameters: int = 1_000_000_000
    offload_optimizer_device: str = "none"
    offload_param_device: str = "none"


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
    gradient_clipping: float = 0.0
    optimizer_name: str | None = None
    optimizer_params: dict = field(default_factory=dict)
    scheduler_name: str | None = None
    scheduler_params: dict = field(default_factory=dict)
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16_enabled: bool = False
    zero: ZeroConfig = field(default_factory=ZeroConfig)
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
        _check_keys("", raw, _TOP_KEYS)
        train, micro, gas = _batch_triangle(raw, world_size)
        out = cls(train, micro, gas, raw=raw)
        if "gradient_clipping" in raw:
            out.gradient_clipping = _nonneg_float("gradient_clipping", raw["gradient_clipping"])
        if "optimizer" in raw:
            out.optimizer_name, out.optimizer_params = _optimizer(raw["optimizer"])
        if "scheduler" in raw:
            out.scheduler_name, out.scheduler_params = _scheduler(raw["scheduler"])
        out.fp16 = _fp16(raw.get("fp16", {}))
        bf16 = _check_keys("bf16", raw.get("bf16", {}), _BF16_KEYS)
        out.bf16_enabled = _bool("bf16.enabled", bf16.get("enabled", False))
        if out.fp16.enabled and out.bf16_enabled:
            raise DeepSpeedConfigError(
                "config keys 'fp16.enabled' and 'bf16.enabled' are both true; enable at most one")
        out.zero = _zero(raw.get("zero_optimization", {}))
        return out


def _batch_triangle(raw: dict, world_size: int) -> tuple[int, int, int]:
    train = raw.get("train_batch_size")
    micro = raw.get("train_micro_batch_size_per_gpu")
    gas = raw.get("gradient_accumulation_steps")
    train = None if train is None else _pos_int("train_batch_size", train)
    micro = None if micro is None else _pos_int("train_micro_batch_size_per_gpu", micro)
    gas = None if gas is None else _pos_int("gradient_accumulation_steps", gas)
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
    _check_keys("optimizer", section, {"type", "params"})
    kind = section.get("type")
    if not isinstance(kind, str) or kind.lower() not in _OPTIMIZERS:
        raise _err("optimizer.type", kind, str(sorted(_OPTIMIZERS.values())))
    name = _OPTIMIZERS[kind.lower()]
    params = _check_keys("optimizer.params", section.get("params", {}), _OPTIMIZER_PARAMS[name])
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if key in params:
            _nonneg_float(f"optimizer.params.{key}", params[key])
    if "betas" in params:
        b = params["betas"]
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1
                                                                    for x in b)):
            raise _err("optimizer.params.betas", b, "a list of two numbers in [0, 1)")
    for key in ("amsgrad", "torch_adam", "adam_w_mode", "nesterov"):
        if key in params:
            _bool(f"optimizer.params.{key}", params[key])
    return name, dict(params)


def _scheduler(section: Any) -> tuple[str, dict]:
    _check_keys("scheduler", section, {"type", "params"})
    kind = section.get("type")
    if kind not in _SCHEDULER_PARAMS:
        raise _err("scheduler.type", kind, str(sorted(_SCHEDULER_PARAMS)))
    params = _check_keys("scheduler.params", section.get("params", {}), _SCHEDULER_PARAMS[kind])
    if "warmup_type" in params and params["warmup_type"] not in ("log", "linear"):
        raise _err("scheduler.params.warmup_type", params["warmup_type"], "['linear', 'log']")
    if "warmup_num_steps" in params:
        _pos_int("scheduler.params.warmup_num_steps", params["warmup_num_steps"])
    if "total_num_steps" in params:
        _pos_int("scheduler.params.total_num_steps", params["total_num_steps"])
    elif kind != "WarmupLR":
        raise DeepSpeedConfigError(f"config key 'scheduler.params.total_num_steps' is required by {kind}")
    return kind, dict(params)


def _fp16(section: Any) -> FP16Config:
    _check_keys("fp16", section, _FP16_KEYS)
    out = FP16Config()
    out.enabled = _bool("fp16.enabled", section.get("enabled", False))
    if section.get("auto_cast", False):
        raise _err("fp16.auto_cast", section["auto_cast"], "false (inputs are cast by the caller)")
    out.loss_scale = _nonneg_float("fp16.loss_scale", section.get("loss_scale", 0.0))
    out.initial_scale_power = _pos_int("fp16.initial_scale_power", section.get("initial_scale_power", 16), 0)
    out.loss_scale_window = _pos_int("fp16.loss_scale_window", section.get("loss_scale_window", 1000))
    out.hysteresis = _pos_int("fp16.hysteresis", section.get("hysteresis", 2))
    out.consecutive_hysteresis = _bool("fp16.consecutive_hysteresis", section.get("consecutive_hysteresis", False))
    out.min_loss_scale = _nonneg_float("fp16.min_loss_scale", section.get("min_loss_scale", 1.0))
    return out


def _offload(key: str, section: Any) -> str:
    _check_keys(key, section, _OFFLOAD_KEYS)
    device = section.get("device", "none")
    if device not in _OFFLOAD_DEVICES:
        raise _err(f"{key}.device", device, str(_OFFLOAD_DEVICES))
    return device


def _zero(section: Any) -> ZeroConfig:
    _check_keys("zero_optimization", section, _ZERO_KEYS)
    out = ZeroConfig()
    stage = section.get("stage", 0)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise _err("zero_optimization.stage", stage, "[0, 1, 2, 3]")
    out.stage = stage
    for key in ("overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions"):
        if key in section:
            value = _bool(f"zero_optimization.{key}", section[key])
            if hasattr(out, key):
                setattr(out, key, value)
    for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                "stage3_max_live_parameters", "stage3_max_reuse_distance"):
        if key in section:
            value = _pos_int(f"zero_optimization.{key}", section[key])
            if hasattr(out, key):
                setattr(out, key, value)
    if "stage3_param_persistence_threshold" in section:
        out.stage3_param_persistence_threshold = _pos_int(
            "zero_optimization.stage3_param_persistence_threshold", section["stage3_param_persistence_threshold"], 0)
    if "offload_optimizer" in section:
        out.offload_optimizer_device = _offload("zero_optimization.offload_optimizer", section["offload_optimizer"])
    if "offload_param" in section:
        out.offload_param_device = _offload("zero_optimization.offload_param", section["offload_param"])
        if out.offload_param_device != "none" and stage != 3:
            raise _err("zero_optimization.offload_param.device", out.offload_param_device,
                       "'none' unless zero_optimization.stage is 3")
    return out
