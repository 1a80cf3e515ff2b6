"""A DeepSpeed JSON config as DeepSpeed reads it, turned into the one spelling :mod:`ds_zero.runtime.config` parses.

Before the core parser sees the dict: the legacy forms become today's (``"bfloat16"`` is ``"bf16"`` unless both are
given; ``"zero_optimization": true`` is stage 1 with the top-level ``allgather_size``, DeepSpeed's
``read_zero_config_deprecated``), the second spellings become the documented ones (``prefetch_bucket_size`` is
``stage3_prefetch_bucket_size``, ...; ``aio.thread_count`` is ``intra_op_parallelism``), and the options DeepSpeed
knows but ds_zero does not implement are logged and dropped, refused when they would change the result. The
``optimizer`` and ``scheduler`` sections are read here too: they name the torch optimizer and the lr schedule
:func:`ds_zero.initialize` builds, which the engine then takes as objects.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ds_zero.runtime import config as core
from ds_zero.runtime.config_utils import as_bool, as_float, as_int, config_err, split_keys, where

logger = logging.getLogger("ds_zero.config")

# DeepSpeed options with no counterpart here, per section: logged once at load and dropped.
_IGNORED = {
    "": {
        "wall_clock_breakdown", "zero_allow_untested_optimizer", "dump_state",
        "zero_force_ds_cpu_optimizer", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "amp",
        "communication_data_type", "seq_parallel_communication_data_type", "flops_profiler", "tensorboard", "wandb",
        "csv_monitor", "comet", "elasticity", "checkpoint", "data_efficiency", "data_types", "compile",
        "memory_breakdown", "sparse_attention", "autotuning", "comms_logger", "torch_autocast", "disable_allgather",
        "gradient_allreduce_op", "use_data_before_expert_parallelism", "log_level",
        "monitor_config", "eigenvalue", "progressive_layer_drop", "curriculum_learning", "quantize_training",
        "weight_quantization", "compression_training", "hybrid_engine", "nebula", "disable_python_gc",
        "managed_gradient_accumulation", "check_overflow", "tensor_parallel", "sequence_parallel_size",
    },
    "zero_optimization": {
        "use_multi_rank_bucket_allreduce", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
        "zenflow", "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload", "model_persistence_threshold",
        "stage3_model_persistence_threshold",
        "module_granularity_threshold", "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
        "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
        "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients", "parameter_alignment",
        "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
        "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
        "mics_shard_size", "mics_hierarchical_params_gather",
    },
    "offload": {"super_offload", "cpuadam_cores_perc"},
    "fp16": {"fp16_master_weights_and_grads"},
    "bf16": {"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads", "bf16_optimizer_states"},
    "aio": {"single_submit", "overlap_events"},  # libaio submission details
}
# DeepSpeed options checked as DeepSpeed checks them and accepted with no effect here: section -> {key: kind}.
_ACCEPTED = {
    "": {"dataloader_drop_last": "bool"},  # read by the loader initialize(training_data=) builds
    "zero_optimization": {"allgather_partitions": "bool", "gather_16bit_weights_on_model_save": "bool",  # read by
                          "stage3_gather_16bit_weights_on_model_save": "bool",  # the engine's save_16bit_model
                          "stage3_gather_fp16_weights_on_model_save": "bool"},
    "offload_param": {"max_in_cpu": "int"},
    "activation_checkpointing": {"synchronize_checkpoint_boundary": "bool", "profile": "bool"},
    "pipeline": {"seed_layers": "bool", "pipe_partitioned": "bool", "grad_partitioned": "bool", "stages": "stages",
                 "partition": "any"},
}
# Options that change the result: only their default is accepted. section -> {key: (default, what is allowed)}.
_REFUSED = {
    "fp16": {"auto_cast": (False, "false (inputs are cast by the caller)")},
    "aio": {"use_gds": (False, "false (GPUDirect Storage is not supported by ds_zero)")},
    "offload_optimizer": {"ratio": (1.0, "1.0 (partial offload is not supported by ds_zero)")},
}
_ZERO_ALIASES = {"prefetch_bucket_size": "stage3_prefetch_bucket_size",
                 "param_persistence_threshold": "stage3_param_persistence_threshold",
                 "max_live_parameters": "stage3_max_live_parameters",
                 "max_reuse_distance": "stage3_max_reuse_distance"}


def _drop(section: str, d: Any, kind: str | None = None) -> Any:
    """``d`` without the DeepSpeed options ds_zero does not implement (logged), the accepted ones checked."""
    if not isinstance(d, dict):
        return d
    d = dict(d)
    for key in sorted(_IGNORED.get(kind or section, set()) & set(d)):
        logger.warning("config key %r %s is a DeepSpeed option ds_zero does not implement; ignored", key,
                       where(section))
        del d[key]
    name = section.rsplit(".", 1)[-1]
    for key, (default, allowed) in _REFUSED.get(name, {}).items():
        value = d.pop(key, default)
        if value != default:
            raise config_err(f"{section}.{key}", value, allowed)
    for key, kind_ in _ACCEPTED.get(name, {}).items():
        if key in d:
            _check(f"{section}.{key}", d.pop(key), kind_)
    return d


def _check(key: str, value: Any, kind: str) -> None:
    if kind == "bool":
        as_bool(key, value)
    elif kind == "int":
        as_int(key, value, 0)
    elif kind == "stages" and value != "auto":
        as_int(key, value)


def to_canonical(raw: dict) -> dict:
    """The config with DeepSpeed's other spellings in the one :class:`ds_zero.runtime.config.DeepSpeedConfig` reads,
    and its unimplemented options dropped; ``optimizer``, ``scheduler`` and ``allgather_size`` taken out."""
    d = _drop("", raw)
    for key in ("optimizer", "scheduler"):
        d.pop(key, None)
    allgather_size = d.pop("allgather_size", 500_000_000)
    if "bfloat16" in d:  # DeepSpeed's get_bfloat16_config: "bf16", else the older "bfloat16"
        bf16 = d.pop("bfloat16")
        d.setdefault("bf16", bf16)
    for section in ("fp16", "bf16", "aio", "activation_checkpointing", "pipeline"):
        if section in d:
            d[section] = _drop(section, d[section])
    if isinstance(d.get("aio"), dict) and "thread_count" in d["aio"]:  # DeepSpeed renamed it intra_op_parallelism
        d["aio"]["intra_op_parallelism"] = d["aio"].pop("thread_count")
    if "zero_optimization" in d:
        d["zero_optimization"] = canonical_zero(d["zero_optimization"], allgather_size)
    return d


def canonical_zero(section: Any, allgather_size: Any = 500_000_000) -> Any:
    key = "zero_optimization"
    if isinstance(section, bool):
        logger.warning("config key %r: the boolean form is deprecated (true is stage 1, false stage 0); use "
                       "{'stage': N, ...}", key)
        return {"stage": 1, "allgather_bucket_size": allgather_size} if section else {"stage": 0}
    section = _drop(key, section)
    if not isinstance(section, dict):
        return section
    for short, documented in _ZERO_ALIASES.items():
        if short in section:
            section[documented] = section.pop(short)
    for name in ("offload_optimizer", "offload_param"):
        if section.get(name) is not None:
            section[name] = _drop(f"{key}.{name}", section[name], kind="offload")
    return section


@dataclass
class DeepSpeedZeroConfig(core.DeepSpeedZeroConfig):
    """The core's zero section, also under the names older DeepSpeed code reads."""

    @property
    def stage3_prefetch_bucket_size(self) -> int:
        return self.prefetch_bucket_size

    @property
    def stage3_param_persistence_threshold(self) -> int:
        return self.param_persistence_threshold

    @property
    def stage3_max_live_parameters(self) -> int:
        return self.max_live_parameters

    @property
    def stage3_max_reuse_distance(self) -> int:
        return self.max_reuse_distance

    @property
    def offload_optimizer_device(self) -> str:
        return self.offload_optimizer.device

    @property
    def offload_param_device(self) -> str:
        return self.offload_param.device


def parse_zero_config(section: Any, allgather_size: Any = 500_000_000) -> DeepSpeedZeroConfig:
    """``zero_optimization`` in any of DeepSpeed's spellings (``allgather_size``: the legacy top-level key read
    with ``"zero_optimization": true``)."""
    return _as_compat_zero(core.DeepSpeedZeroConfig.from_dict(canonical_zero(section, allgather_size)))


def _as_compat_zero(z: core.DeepSpeedZeroConfig) -> DeepSpeedZeroConfig:
    return DeepSpeedZeroConfig(**{f.name: getattr(z, f.name) for f in dataclasses.fields(z)})


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
        raise core.DeepSpeedConfigError(f"config key 'scheduler.params.total_num_steps' is required by {kind}")
    return kind, dict(params)


@dataclass
class DeepSpeedConfig(core.DeepSpeedConfig):
    """DeepSpeed's config as DeepSpeed reads it: any of its spellings, and the optimizer and lr schedule it names."""

    optimizer_name: str | None = None
    optimizer_params: dict = field(default_factory=dict)
    scheduler_name: str | None = None
    scheduler_params: dict = field(default_factory=dict)

    @property
    def zero_optimization_stage(self) -> int:
        return self.zero.stage

    @classmethod
    def load(cls, config: dict | str | os.PathLike, world_size: int) -> DeepSpeedConfig:
        raw = copy.deepcopy(core.read_config(config))
        out = super().load(to_canonical(raw), world_size)
        out.raw = raw
        out.zero = _as_compat_zero(out.zero)
        if "optimizer" in raw:
            out.optimizer_name, out.optimizer_params = _optimizer(raw["optimizer"])
        if "scheduler" in raw:
            out.scheduler_name, out.scheduler_params = _scheduler(raw["scheduler"])
        return out
