"""ds_zero: DeepSpeed's engine rebuilt small: ZeRO stages 0-3 with CPU/NVMe offload, the 1F1B pipeline engine,
activation checkpointing, fp16/bf16, DeepSpeed's JSON config and checkpoints."""

from __future__ import annotations

from ds_zero import checkpointing, ops, pipe, runtime, utils, zero
from ds_zero.arguments import add_config_arguments, config_from_args
from ds_zero.config import DeepSpeedConfig, DeepSpeedConfigError
from ds_zero.engine import DeepSpeedEngine, init_distributed
from ds_zero.pipe import PipelineModule
from ds_zero.runtime import utils as _runtime_utils  # noqa: F401 - deepspeed.runtime.utils.set_random_seed

__version__ = "0.1.0"

__all__ = ["initialize", "init_distributed", "add_config_arguments", "DeepSpeedEngine", "DeepSpeedConfig",
           "DeepSpeedConfigError", "PipelineModule", "checkpointing", "ops", "pipe", "runtime", "utils", "zero"]


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port: int = 29500, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """Wrap ``model`` for training; returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    ``deepspeed.initialize``'s signature and return value. ``config`` is a dict or a JSON path
    (``config_params`` is its older name, ``args.deepspeed_config`` the oldest). A
    :class:`ds_zero.pipe.PipelineModule` gets a :class:`ds_zero.pipe.PipelineEngine`.
    """
    if model is None:
        raise ValueError("initialize needs model=")
    if mesh_param is not None:
        raise ValueError("mesh_param (DeepSpeed's device-mesh shortcut) is not supported by ds_zero; pass an mpu")
    from_args = config_from_args(args) if args is not None else None
    if config is not None and config_params is not None:
        raise ValueError("pass the config as config= or config_params=, not both")
    if config is None:
        config = config_params
    if config is not None and from_args is not None:
        raise ValueError(f"a config was given both to initialize() and as args.deepspeed_config={from_args!r}; "
                         "use one (DeepSpeed refuses this too)")
    if config is None:
        config = from_args
    if config is None:
        raise ValueError("initialize needs a config: a dict or the path of a DeepSpeed JSON file")
    kwargs = dict(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                  training_data=training_data, lr_scheduler=lr_scheduler, mpu=mpu,
                  dist_init_required=dist_init_required, collate_fn=collate_fn, config=config,
                  distributed_port=distributed_port)
    if isinstance(model, PipelineModule):
        from ds_zero.pipe.engine import PipelineEngine

        if mpu is not None:
            raise ValueError("a PipelineModule brings its own process grid (topology); do not pass mpu")
        engine = PipelineEngine(**kwargs)
    else:
        engine = DeepSpeedEngine(**kwargs)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
