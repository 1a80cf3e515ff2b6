"""``engine.save_checkpoint`` / ``load_checkpoint`` in DeepSpeed's file layout, written atomically.

The states themselves are the core's (the module's state dict, each rank's ``optimizer.state_dict()`` with its
fp32 master partition, the optimizer's ``layout()`` that ``zero_to_fp32`` consolidates); this module lays them out
as DeepSpeed does. Layout: ``SAVE_DIR/latest`` holds the tag; ``SAVE_DIR/TAG/mp_rank_00_model_states.pt``
(rank 0: module weights and buffers, scheduler, counters, param names/shapes, the partition layout; at ZeRO-3 each
rank writes it as ``zero_pp_rank_R_mp_rank_00_model_states.pt``) and ``SAVE_DIR/TAG/zero_pp_rank_R_mp_rank_00_optim_
states.pt`` (each rank: its fp32 master partition, optimizer states, loss scaler), and ``zero_to_fp32.py`` beside the
tags. Every file is written under a temporary name then renamed; the whole tag directory is assembled as
``.TAG.partial`` and renamed into place, and ``latest`` is replaced last, so a crash mid-save leaves the previous
checkpoint loadable.
"""

from __future__ import annotations

import logging
import os
import stat

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


def model_file(mp_rank: int = 0, dp_rank: int | None = None) -> str:
    """``mp_rank_XX_model_states.pt``; at ZeRO-3, where every data-parallel rank writes one, DeepSpeed's
    ``zero_pp_rank_R_mp_rank_XX_model_states.pt`` (``dp_rank`` given)."""
    prefix = "" if dp_rank is None else f"zero_pp_rank_{dp_rank}_"
    return f"{prefix}mp_rank_{mp_rank:02d}_model_states.pt"


def find_model_file(path: str, mp_rank: int = 0, dp_rank: int = 0) -> str:
    """The model states of ``mp_rank`` in a tag folder of either layout (ZeRO-3's per-rank file, or the one)."""
    for name in (model_file(mp_rank, dp_rank), model_file(mp_rank)):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise FileNotFoundError(f"no {model_file(mp_rank)} or {model_file(mp_rank, dp_rank)} in {path!r}")


def optim_file(rank: int, mp_rank: int = 0) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


# deepspeed.checkpoint.constants' file-name parts, and deepspeed.checkpoint.utils' names built from them
MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX = "mp_rank_", "_model_states.pt"
ZERO_FILE_PREFIX, OPTIM_FILE_SUFFIX = "zero_pp_rank_", "_optim_states.pt"


def get_model_ckpt_name_for_rank(base_folder, mp_rank_str) -> str:
    """``base_folder/mp_rank_<mp_rank_str>_model_states.pt`` (``mp_rank_str`` as written, e.g. ``"00"``)."""
    return os.path.join(base_folder, MODEL_FILE_PREFIX + mp_rank_str + MODEL_FILE_SUFFIX)


def get_zero_ckpt_name_for_rank(base_folder, dp_rank, mp_rank) -> str:
    """``base_folder/zero_pp_rank_<dp>_mp_rank_<mp:02d>_optim_states.pt``, the file :func:`optim_file` names."""
    return os.path.join(base_folder, optim_file(dp_rank, mp_rank))


def get_layer_ckpt_name_for_rank(base_folder, layer_id, tp_rank) -> str:
    """A pipeline layer's file, ``base_folder/<layer_id>-model_<tp:02d>_model_states.pt``."""
    return os.path.join(base_folder, f"{layer_id}-model_{tp_rank:02d}{MODEL_FILE_SUFFIX}")


def _model_states(engine, client_state: dict) -> dict:
    names = {id(p): n for n, p in engine.module.named_parameters()}
    groups = engine.optimizer.trainable_param_groups
    partitioned = {n for n, p in engine.module.named_parameters() if is_zero_param(p)}
    # ZeRO-3 params are empty outside forward; their values live in the optimizer partitions.
    module_sd = {k: v.detach().clone() for k, v in engine.module.state_dict().items() if k not in partitioned}
    return {
        "module": module_sd,
        "frozen_param_names": [n for n, p in engine.module.named_parameters() if not p.requires_grad],
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
    """Every rank writes into the folder it names, as DeepSpeed's ranks do, so ranks whose ``save_dir`` differ (a
    timestamp taken on each) each get theirs; the lowest rank naming a folder assembles and renames its tag
    directory, rank 0 writes ``latest`` and DeepSpeed's ``zero_to_fp32.py`` beside the tags."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    if not tag or os.sep in tag or tag.startswith("."):
        raise ValueError(f"checkpoint tag {tag!r} must be a non-empty name without '{os.sep}' or a leading '.'")
    save_dir = os.path.abspath(str(save_dir))
    rank = dist.get_rank()
    dirs = [None] * dist.get_world_size()
    dist.all_gather_object(dirs, save_dir)
    if rank == 0 and len(set(dirs)) > 1:
        logger.warning("ranks save into different folders (%s): each keeps its own rank's files, as in DeepSpeed",
                       sorted(set(dirs)))
    leader = dirs.index(save_dir) == rank  # the lowest rank writing into this folder
    staging = staging_dir(save_dir, tag)
    if leader:
        fresh_staging_dir(save_dir, tag)
    dist.barrier()
    groups = engine.groups
    stage3 = engine.zero_optimization_stage() == 3
    if stage3 or groups.dp_rank == 0:
        atomic_torch_save(_model_states(engine, client_state or {}),
                          os.path.join(staging, model_file(groups.slice_rank, groups.dp_rank if stage3 else None)))
    sd = engine.optimizer.state_dict()
    sd["zero_stage"] = engine.zero_optimization_stage()
    atomic_torch_save(sd, os.path.join(staging, optim_file(groups.dp_rank, groups.slice_rank)))
    dist.barrier()
    if leader:
        replace_dir(staging, save_dir, tag)
    if rank == 0:
        if save_latest:
            atomic_write_text(tag, os.path.join(save_dir, LATEST))
        if engine.zero_optimization_stage() > 0 or engine.bfloat16_enabled():  # DeepSpeed: with a ZeRO checkpoint
            _copy_recovery_script(save_dir)
    dist.barrier()
    return True


def _copy_recovery_script(save_dir: str) -> None:
    """``zero_to_fp32.py`` and ``zero_to_torch.py`` beside the tags, executable, for ``python zero_to_fp32.py .
    out_dir`` (DeepSpeed's ``_copy_recovery_script``)."""
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "utils", script)
        dst = os.path.join(save_dir, script)
        with open(src) as f:
            atomic_write_text(f.read(), dst)
        os.chmod(dst, os.stat(dst).st_mode | stat.S_IEXEC)


_CPU = torch.device("cpu")  # DeepSpeed's default; a device is immutable, so one object serves every call


def clone_tensors_for_torch_save(item, device=_CPU):
    """``item`` with every tensor in it (nested in lists, tuples, dicts) replaced by a copy on ``device`` that owns
    only its own storage, so ``torch.save`` writes no flat buffer a view points into
    (``deepspeed.checkpoint.utils.clone_tensors_for_torch_save``)."""
    if torch.is_tensor(item):
        device = torch.device(device) if isinstance(device, str) else device
        return item.detach().clone() if device == item.device else item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item


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
    states = torch.load(find_model_file(path, groups.slice_rank, groups.dp_rank), map_location="cpu",
                        weights_only=False)
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
