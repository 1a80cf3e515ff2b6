"""``engine.save_checkpoint`` / ``load_checkpoint`` in DeepSpeed's file layout, written atomically.

The states themselves are the core's (the module's state dict, each rank's ``optimizer.state_dict()`` with its
fp32 master partition, the optimizer's ``layout()`` that ``zero_to_fp32`` consolidates); this module lays them out
as DeepSpeed does. Layout: ``SAVE_DIR/latest`` holds the tag; ``SAVE_DIR/TAG/mp_rank_00_model_states.pt``
(rank 0: module weights and buffers, scheduler, counters, param names/shapes, the partition layout)
and ``SAVE_DIR/TAG/zero_pp_rank_R_mp_rank_00_optim_states.pt`` (each rank: its fp32 master
partition, optimizer states, loss scaler). Every file is written under a temporary name then
renamed; the whole tag directory is assembled as ``.TAG.partial`` and renamed into place, and
``latest`` is replaced last, so a crash mid-save leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ds_zero._infra.atomic_io import (
    atomic_torch_save,
    atomic_write_text,
    existing_dir,
    fresh_staging_dir,
    replace_dir,
    staging_dir,
)
from ds_zero.runtime.zero.partition_parameters import is_zero_param

logger = logging.getLogger(__name__)

MODEL_FILE = "mp_rank_00_model_states.pt"
LATEST = "latest"


def model_file(mp_rank: int = 0) -> str:
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


def optim_file(rank: int, mp_rank: int = 0) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def _model_states(engine, client_state: dict) -> dict:
    names = {id(p): n for n, p in engine.module.named_parameters()}
    groups = engine.optimizer.trainable_param_groups
    partitioned = {n for n, p in engine.module.named_parameters() if is_zero_param(p)}
    # ZeRO-3 params are empty outside forward; their values live in the optimizer partitions.
    module_sd = {k: v.detach().clone() for k, v in engine.module.state_dict().items() if k not in partitioned}
    return {
        "module": module_sd,
        "param_names": [[names[id(p)] for p in ps] for ps in groups],
        "param_shapes": [[tuple(getattr(p, "ds_shape", p.shape)) for p in ps] for ps in groups],
        "layout": engine.optimizer.layout(),
        "zero_stage": engine.zero_optimization_stage(),
        "dp_world_size": engine.dp_world_size,
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
        "global_steps": engine.global_steps, "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps, "micro_steps": engine.micro_steps,
        "ds_config": engine.config.raw,
        "client_state": client_state,
    }


def save_checkpoint(engine, save_dir, tag=None, client_state=None, save_latest: bool = True) -> bool:
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    if not tag or os.sep in tag or tag.startswith("."):
        raise ValueError(f"checkpoint tag {tag!r} must be a non-empty name without '{os.sep}' or a leading '.'")
    save_dir = str(save_dir)
    rank = dist.get_rank()
    staging = staging_dir(save_dir, tag)
    if rank == 0:
        fresh_staging_dir(save_dir, tag)
    dist.barrier()
    groups = engine.groups
    if groups.dp_rank == 0:
        atomic_torch_save(_model_states(engine, client_state or {}),
                          os.path.join(staging, model_file(groups.slice_rank)))
    sd = engine.optimizer.state_dict()
    sd["zero_stage"] = engine.zero_optimization_stage()
    atomic_torch_save(sd, os.path.join(staging, optim_file(groups.dp_rank, groups.slice_rank)))
    dist.barrier()
    if rank == 0:
        replace_dir(staging, save_dir, tag)
        if save_latest:
            atomic_write_text(tag, os.path.join(save_dir, LATEST))
    dist.barrier()
    return True


def resolve_tag_dir(load_dir, tag=None) -> str | None:
    load_dir = str(load_dir)
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        if not os.path.isfile(latest):
            return None
        with open(latest) as f:
            tag = f.read().strip()
    path = existing_dir(load_dir, str(tag))
    if path is None:
        raise FileNotFoundError(f"checkpoint tag directory {os.path.join(load_dir, str(tag))!r} does not exist")
    return path


def load_checkpoint(engine, load_dir, tag=None, load_optimizer_states: bool = True,
                    load_lr_scheduler_states: bool = True):
    """Returns ``(load_path, client_state)``, or ``(None, None)`` when there is no ``latest`` (as DeepSpeed)."""
    path = resolve_tag_dir(load_dir, tag)
    if path is None:
        logger.warning("no 'latest' file in %s; nothing loaded", load_dir)
        return None, None
    groups = engine.groups
    states = torch.load(os.path.join(path, model_file(groups.slice_rank)), map_location="cpu", weights_only=False)
    if states["dp_world_size"] != engine.dp_world_size or states["zero_stage"] != engine.zero_optimization_stage():
        raise ValueError(f"checkpoint {path!r} is ZeRO stage {states['zero_stage']} at world size "
                         f"{states['dp_world_size']}; this engine is stage {engine.zero_optimization_stage()} at "
                         f"{engine.dp_world_size} (convert it with ds-zero-to-fp32 and load the weights instead)")
    missing, unexpected = engine.module.load_state_dict(states["module"], strict=False)
    partitioned = {n for n, p in engine.module.named_parameters() if is_zero_param(p)}
    if unexpected or set(missing) - partitioned:
        raise ValueError(f"checkpoint module state does not fit the model: missing {sorted(set(missing) - partitioned)}"
                         f", unexpected {sorted(unexpected)}")
    optim = torch.load(os.path.join(path, optim_file(groups.dp_rank, groups.slice_rank)), map_location="cpu",
                       weights_only=False)
    if load_optimizer_states:
        engine.optimizer.load_state_dict(optim)
    else:
        engine.optimizer._load_masters(optim["master_partitions"])
        engine.optimizer._update_params_from_master()
    if load_lr_scheduler_states and engine.lr_scheduler is not None and states["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    for key in ("global_steps", "global_samples", "skipped_steps", "micro_steps"):
        setattr(engine, key, states[key])
    engine.optimizer.zero_grad()
    return path, states["client_state"]
