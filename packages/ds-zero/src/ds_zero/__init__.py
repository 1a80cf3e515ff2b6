"""ds_zero: DeepSpeed's engine rebuilt small: ZeRO stages 0-3 with CPU/NVMe offload, the 1F1B pipeline engine,
activation checkpointing, fp16/bf16, DeepSpeed's JSON config and checkpoints."""

from ds_zero import accelerator, checkpoint, checkpointing, comm, moe, ops, pipe, runtime, utils, zero
from ds_zero._compat.arguments import add_config_arguments, config_from_args
from ds_zero._compat.comm import init_distributed
from ds_zero._compat.config import DeepSpeedConfig
from ds_zero._compat.engine import DeepSpeedEngine, PipelineEngine
from ds_zero._compat.init_on_device import OnDevice
from ds_zero._compat.initialize import initialize
from ds_zero.accelerator import get_accelerator
from ds_zero.pipe import PipelineModule
from ds_zero.runtime import utils as _runtime_utils  # noqa: F401 - deepspeed.runtime.utils.set_random_seed
from ds_zero.runtime.config_utils import DeepSpeedConfigError

__version__ = "0.1.0"

__all__ = ["initialize", "init_distributed", "add_config_arguments", "config_from_args", "DeepSpeedEngine",
           "OnDevice", "PipelineEngine",
           "get_accelerator", "DeepSpeedConfig", "DeepSpeedConfigError", "PipelineModule", "accelerator",
           "checkpoint", "checkpointing", "comm", "moe", "ops", "pipe", "runtime", "utils", "zero"]
