"""``save`` with torch's arguments (torch/distributed/checkpoint/state_dict_saver.py): the storage a
``checkpoint_id`` names, ``Stateful`` values saved as their ``state_dict()``, one process when pt_dist is not
initialised; then the core's save (``pt_dist/checkpoint/_checkpointer.py``)."""

from __future__ import annotations

import os

from pt_dist._compat.checkpoint.storage_utils import _storage_setup, _use_dist
from pt_dist.checkpoint._checkpointer import _save_state_dict
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE, Metadata
from pt_dist.checkpoint.planner import SavePlanner
from pt_dist.checkpoint.stateful import Stateful
from pt_dist.checkpoint.storage import StorageWriter

__all__ = ["save"]


def save(state_dict: STATE_DICT_TYPE, *, checkpoint_id: str | os.PathLike | None = None,
         storage_writer: StorageWriter | None = None, planner: SavePlanner | None = None, process_group=None,
         no_dist: bool = False, use_collectives: bool = True) -> Metadata:
    """Collective over ``process_group`` (default: the world): each rank saves what it holds of ``state_dict``
    (its DTensor blocks; replicated values once in all), the coordinator the metadata. Returns the Metadata."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"pt_dist.checkpoint.save: state_dict must be a dict, got {type(state_dict).__name__}")
    if not use_collectives:
        raise ValueError("pt_dist.checkpoint.save: use_collectives=False (rank-local metadata) is not supported")
    storage_writer = _storage_setup(storage_writer, checkpoint_id, reader=False)
    state_dict = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
    return _save_state_dict(state_dict, storage_writer, process_group, no_dist=not _use_dist(no_dist, "save"),
                            planner=planner)

