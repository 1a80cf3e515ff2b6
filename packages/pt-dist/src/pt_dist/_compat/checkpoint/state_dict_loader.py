"""``load`` with torch's arguments (torch/distributed/checkpoint/state_dict_loader.py): the storage a
``checkpoint_id`` names, ``Stateful`` values loaded through their ``state_dict()`` and handed back to
``load_state_dict``, one process when pt_dist is not initialised; then the core's load
(``pt_dist/checkpoint/_checkpointer.py``); the deprecated ``load_state_dict``."""

from __future__ import annotations

import os
import warnings

from pt_dist._compat.checkpoint.storage_utils import _storage_setup, _use_dist
from pt_dist.checkpoint._checkpointer import _load_state_dict
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE
from pt_dist.checkpoint.planner import LoadPlanner
from pt_dist.checkpoint.stateful import Stateful
from pt_dist.checkpoint.storage import StorageReader

__all__ = ["load", "load_state_dict"]


def load(state_dict: STATE_DICT_TYPE, *, checkpoint_id: str | os.PathLike | None = None,
         storage_reader: StorageReader | None = None, planner: LoadPlanner | None = None, process_group=None,
         no_dist: bool = False) -> None:
    """Collective: fill ``state_dict``'s tensors (and DTensors' local parts) in place from the checkpoint; other
    values are replaced; ``Stateful`` values get ``load_state_dict`` of what was read."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"pt_dist.checkpoint.load: state_dict must be a dict, got {type(state_dict).__name__}")
    storage_reader = _storage_setup(storage_reader, checkpoint_id, reader=True)
    keys = sorted(state_dict)  # (the same order on every rank)
    stateful_sd = {k: state_dict[k].state_dict() if isinstance(state_dict[k], Stateful) else state_dict[k]
                   for k in keys}
    _load_state_dict(stateful_sd, storage_reader, process_group, no_dist=not _use_dist(no_dist, "load"),
                     planner=planner)
    for key in keys:
        if isinstance(state_dict[key], Stateful):
            state_dict[key].load_state_dict(stateful_sd[key])
        else:
            state_dict[key] = stateful_sd[key]



def load_state_dict(state_dict: dict, storage_reader: StorageReader, process_group=None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner: LoadPlanner | None = None) -> None:
    """Deprecated: torch's former ``load`` (no ``Stateful`` handling, an explicit coordinator rank)."""
    warnings.warn("`load_state_dict` is deprecated and will be removed in future versions. Please use `load` "
                  "instead.", FutureWarning, stacklevel=2)
    storage_reader.reset()
    _load_state_dict(state_dict, storage_reader, process_group, coordinator_rank, no_dist, planner)
