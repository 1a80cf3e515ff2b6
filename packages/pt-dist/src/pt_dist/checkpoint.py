"""Sharded checkpoints: every rank saves its own part, atomically (torch.distributed.checkpoint's ``save`` / ``load``).

A save is complete when its ``.metadata`` exists: each rank writes ``__<rank>_0.distcp`` to a temporary name,
fsyncs it and renames it into place; after a barrier rank 0 does the same with ``.metadata``, which names the
save's random token that every rank file carries too. So a save that died half-way is never loaded, and a rank
file left by an earlier save into the same directory is refused. Loading needs the world size that saved.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.object_collectives import all_gather_object, broadcast_object_list

__all__ = ["load", "save"]
METADATA = ".metadata"


def _rank_file(path: Path, rank: int) -> Path:
    return path / f"__{rank}_0.distcp"


def _write_atomically(target: Path, write) -> None:
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def save(state_dict: dict, checkpoint_id, process_group=None) -> None:
    """Collective: write this rank's ``state_dict`` (tensors, and dicts/lists/numbers of them: a model's sharded
    state dict, an optimizer's) under the directory ``checkpoint_id``."""
    group = process_group or c10d.group.WORLD
    rank, world, path = group.rank(), group.size(), Path(checkpoint_id)
    token = [secrets.token_hex(8) if rank == 0 else None]
    broadcast_object_list(token, group_src=0, group=group)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / METADATA).unlink(missing_ok=True)  # from here on the directory holds no complete checkpoint
    c10d.barrier(group=group)
    payload = {"token": token[0], "rank": rank, "world_size": world, "state": state_dict}
    _write_atomically(_rank_file(path, rank), lambda f: torch.save(payload, f))
    c10d.barrier(group=group)
    if rank == 0:
        meta = {"token": token[0], "world_size": world, "files": [_rank_file(path, r).name for r in range(world)]}
        _write_atomically(path / METADATA, lambda f: f.write(json.dumps(meta).encode()))
    c10d.barrier(group=group)


def load(state_dict: dict, checkpoint_id, process_group=None) -> dict:
    """Collective: read this rank's part into ``state_dict`` (tensors copied in place, shapes checked; other
    values and missing keys filled in) and return it. Every rank raises if any rank's part is unusable."""
    group = process_group or c10d.group.WORLD
    rank, world, path = group.rank(), group.size(), Path(checkpoint_id)
    error, saved = None, None
    try:
        meta = json.loads((path / METADATA).read_text())
        if meta["world_size"] != world:
            raise ValueError(f"saved by {meta['world_size']} ranks, loaded by {world}: resharding is not supported")
        saved = torch.load(_rank_file(path, rank), weights_only=True)
        if saved["token"] != meta["token"]:
            raise ValueError(f"{_rank_file(path, rank).name} belongs to another save than {METADATA}")
    except FileNotFoundError as e:
        error = f"rank {rank}: no complete checkpoint at {path} ({Path(e.filename).name} missing: a save not finished?)"
    except (ValueError, KeyError, RuntimeError) as e:
        error = f"rank {rank}: {path}: {e}"
    errors = [None] * world
    all_gather_object(errors, error, group=group)  # so no rank goes on while another failed
    if any(errors):
        raise ValueError("pt_dist.checkpoint.load: " + "; ".join(e for e in errors if e))
    _fill(state_dict, saved["state"], "")
    return state_dict


def _fill(target: dict, saved: dict, where: str) -> None:
    for key, value in saved.items():
        mine = target.get(key)
        if isinstance(mine, torch.Tensor) and isinstance(value, torch.Tensor):
            if mine.shape != value.shape:
                raise ValueError(
                    f"pt_dist.checkpoint.load: {where}{key} has shape {tuple(value.shape)} in the "
                    f"checkpoint, {tuple(mine.shape)} here"
                )
            with torch.no_grad():
                mine.copy_(value)
        elif isinstance(mine, dict) and isinstance(value, dict):
            _fill(mine, value, f"{where}{key}.")
        else:
            target[key] = value
