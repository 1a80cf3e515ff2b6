"""The ``zero_optimization`` section: DeepSpeed's ``DeepSpeedZeroConfig`` and its offload sub-configs.

Mirrors ``deepspeed/runtime/zero/config.py`` and ``offload_config.py``: the same keys, aliases
(``stage3_prefetch_bucket_size`` = ``prefetch_bucket_size``, ...) and defaults (``overlap_comm``
defaults to true at stage 3 only). Keys DeepSpeed knows but ds_zero does not implement are logged and
ignored; a key DeepSpeed does not know is refused, as its pydantic model (``extra="forbid"``) refuses it.
``"zero_optimization": true`` is DeepSpeed's legacy spelling of stage 1 (``read_zero_config_deprecated``).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from ds_zero.config_utils import (
    DeepSpeedConfigError,
    as_bool,
    as_float,
    as_int,
    config_err,
    split_keys,
)

logger = logging.getLogger(__name__)

OFFLOAD_DEVICES = ["none", "cpu", "nvme"]


@dataclass
class DeepSpeedZeroOffloadConfig:
    """``offload_optimizer`` / ``offload_param`` (DeepSpeed's ``DeepSpeedZeroOffload{Optimizer,Param}Config``)."""

    device: str = "none"
    nvme_path: str | None = None
    pin_memory: bool = True
    buffer_count: int = 4
    buffer_size: int = 100_000_000
    max_in_cpu: int = 1_000_000_000
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @property
    def pipeline(self) -> bool:
        return self.pipeline_read or self.pipeline_write


_OFFLOAD_COMMON = {"device", "nvme_path", "pin_memory", "buffer_count"}
_OFFLOAD_OPTIMIZER_KEYS = _OFFLOAD_COMMON | {"pipeline_read", "pipeline_write", "fast_init", "ratio"}
_OFFLOAD_PARAM_KEYS = _OFFLOAD_COMMON | {"buffer_size", "max_in_cpu"}
# DeepSpeed options with no counterpart here: accepted and ignored (logged), as unknown keys are.
_OFFLOAD_IGNORED = {"super_offload", "cpuadam_cores_perc"}


def _offload(key: str, section: Any, param: bool) -> DeepSpeedZeroOffloadConfig:
    if section is None:
        return DeepSpeedZeroOffloadConfig()
    allowed = _OFFLOAD_PARAM_KEYS if param else _OFFLOAD_OPTIMIZER_KEYS
    section = split_keys(key, section, allowed, _OFFLOAD_IGNORED, strict=True)
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
    for name in ("buffer_count", "buffer_size", "max_in_cpu"):
        if name in section:
            setattr(out, name, as_int(f"{key}.{name}", section[name], 0))
    if "ratio" in section and as_float(f"{key}.ratio", section["ratio"]) != 1.0:
        # ZeRO-Offload++ (a fraction of the states stepped on the accelerator) is not built here.
        raise config_err(f"{key}.ratio", section["ratio"], "1.0 (partial offload is not supported by ds_zero)")
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


# key -> (attribute, kind, minimum); aliases are DeepSpeed's
_INT_KEYS = {
    "reduce_bucket_size": ("reduce_bucket_size", 1),
    "allgather_bucket_size": ("allgather_bucket_size", 1),
    "sub_group_size": ("sub_group_size", 1),
    "stage3_prefetch_bucket_size": ("prefetch_bucket_size", 0),
    "prefetch_bucket_size": ("prefetch_bucket_size", 0),
    "stage3_param_persistence_threshold": ("param_persistence_threshold", 0),
    "param_persistence_threshold": ("param_persistence_threshold", 0),
    "stage3_max_live_parameters": ("max_live_parameters", 0),
    "max_live_parameters": ("max_live_parameters", 0),
    "stage3_max_reuse_distance": ("max_reuse_distance", 0),
    "max_reuse_distance": ("max_reuse_distance", 0),
}
_BOOL_KEYS = {"overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions"}
# DeepSpeed knows these; they change nothing here (logged once at load).
_ZERO_IGNORED = {
    "use_multi_rank_bucket_allreduce", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
    "zenflow", "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "module_granularity_threshold", "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
    "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients", "parameter_alignment",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
    "mics_shard_size", "mics_hierarchical_params_gather",
}


@dataclass
class DeepSpeedZeroConfig:
    stage: int = 0
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    allgather_partitions: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    sub_group_size: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    offload_optimizer: DeepSpeedZeroOffloadConfig = field(default_factory=DeepSpeedZeroOffloadConfig)
    offload_param: DeepSpeedZeroOffloadConfig = field(default_factory=DeepSpeedZeroOffloadConfig)

    # The names the rest of ds_zero (and older DeepSpeed) read.
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
    """``allgather_size``: the legacy top-level key read with ``"zero_optimization": true``."""
    key = "zero_optimization"
    if isinstance(section, bool):
        logger.warning("config key %r: the boolean form is deprecated (true is stage 1, false stage 0); use "
                       "{'stage': N, ...}", key)
        section = {"stage": 1, "allgather_bucket_size": allgather_size} if section else {"stage": 0}
    allowed = {"stage", "offload_optimizer", "offload_param"} | _BOOL_KEYS | set(_INT_KEYS)
    section = split_keys(key, section, allowed, _ZERO_IGNORED, strict=True)
    out = DeepSpeedZeroConfig()
    stage = section.get("stage", 0)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise config_err(f"{key}.stage", stage, "[0, 1, 2, 3]")
    out.stage = stage
    out.overlap_comm = stage == 3  # DeepSpeed's default when the key is absent
    for name in _BOOL_KEYS:
        if name in section:
            setattr(out, name, as_bool(f"{key}.{name}", section[name]))
    for name, (attr, minimum) in _INT_KEYS.items():
        if name in section:
            setattr(out, attr, as_int(f"{key}.{name}", section[name], minimum))
    out.offload_optimizer = _offload(f"{key}.offload_optimizer", section.get("offload_optimizer"), param=False)
    out.offload_param = _offload(f"{key}.offload_param", section.get("offload_param"), param=True)
    if out.offload_optimizer.enabled and stage == 0:
        raise config_err(f"{key}.offload_optimizer.device", out.offload_optimizer.device,
                         "'none' unless zero_optimization.stage is 1, 2 or 3")
    if out.offload_optimizer.device == "nvme" and stage != 3:
        raise config_err(f"{key}.offload_optimizer.device", "nvme", "'none' or 'cpu' unless zero_optimization.stage "
                                                                    "is 3 (ZeRO-Infinity swaps stage 3's partitions)")
    if out.offload_param.enabled and stage != 3:
        raise config_err(f"{key}.offload_param.device", out.offload_param.device,
                         "'none' unless zero_optimization.stage is 3")
    return out
