"""``deepspeed.initialize`` (``deepspeed/__init__.py``): DeepSpeed's arguments and config turned into the core
engine's: the config from ``config``, ``config_params`` or ``args.deepspeed_config``, validated before any
communication; the process group joined; the torch optimizer and lr schedule the config names (or the client's,
or callables that build them); the data loader over ``training_data``. A :class:`ds_zero.pipe.PipelineModule` gets
a pipeline engine."""

from __future__ import annotations

import functools
import os

import torch.distributed as dist

from ds_zero._compat.arguments import config_from_args
from ds_zero._compat.basic_optimizer import build_basic_optimizer, client_optimizer
from ds_zero._compat.comm import init_distributed
from ds_zero._compat.config import DeepSpeedConfig
from ds_zero._compat.dataloader import build_dataloader
from ds_zero._compat.engine import DeepSpeedEngine, PipelineEngine
from ds_zero._compat.lr_schedules import SCHEDULERS
from ds_zero.pipe.module import PipelineModule


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port: int = 29500, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """Wrap ``model`` for training; returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    ``config`` is a dict or a JSON path (``config_params`` is its older name, ``args.deepspeed_config`` the oldest).
    """
    if model is None:
        raise ValueError("initialize needs model=")
    if mesh_param is not None:
        raise ValueError("mesh_param (DeepSpeed's device-mesh shortcut) is not supported by ds_zero; pass an mpu")
    config = _the_config(args, config, config_params)
    pipeline = isinstance(model, PipelineModule)
    if pipeline and mpu is not None:
        raise ValueError("a PipelineModule brings its own process grid (topology); do not pass mpu")
    # Validate everything before touching the process group, so bad input fails alone and fast.
    grid = model.mpu() if pipeline else mpu
    if grid is not None and hasattr(grid, "get_data_parallel_world_size"):
        world = int(grid.get_data_parallel_world_size())  # the batch triangle is per data-parallel rank
    else:
        world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    cfg = DeepSpeedConfig.load(config, world)
    if optimizer is None and cfg.optimizer_name is None:
        raise ValueError("no optimizer: pass optimizer= or set the 'optimizer' config key")
    if optimizer is not None and cfg.optimizer_name is not None:
        raise ValueError("both a client optimizer and the 'optimizer' config key were given; use one")
    model_parameters = list(model.parameters() if model_parameters is None else model_parameters)
    init_distributed(dist_init_required=dist_init_required, distributed_port=distributed_port)
    client = optimizer
    if optimizer is None:
        optimizer = build_basic_optimizer(cfg.optimizer_name, cfg.optimizer_params, model_parameters,
                                          offload=cfg.zero.offload_optimizer.enabled)
    else:
        optimizer = client_optimizer(optimizer, model_parameters)
    client_scheduler = lr_scheduler
    if lr_scheduler is None and cfg.scheduler_name is not None:
        lr_scheduler = functools.partial(SCHEDULERS[cfg.scheduler_name], **cfg.scheduler_params)
    if pipeline:
        engine = PipelineEngine(model, optimizer, cfg, lr_scheduler=lr_scheduler)
    else:
        engine = DeepSpeedEngine(model, optimizer, cfg, mpu=mpu, lr_scheduler=lr_scheduler)
    engine.client_optimizer, engine.client_lr_scheduler = client, client_scheduler
    if args is not None and hasattr(args, "local_rank"):
        args.local_rank = engine.local_rank  # DeepSpeed aligns it with LOCAL_RANK
    engine.collate_fn = collate_fn  # DeepSpeed's engine keeps it for deepspeed_io
    engine.training_dataloader = build_dataloader(engine, training_data, collate_fn, pipeline=pipeline)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _the_config(args, config, config_params):
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
    return config
