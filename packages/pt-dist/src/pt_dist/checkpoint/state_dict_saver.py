"""``save`` (torch/distributed/checkpoint/state_dict_saver.py): two collective steps over the group.

1. plan (``_DistWrapper.reduce_scatter``): every rank makes its local plan, the coordinator gathers them, dedups
   and builds the ``Metadata``, and scatters each rank its part;
2. write (``all_reduce``): every rank writes its items, the coordinator gathers the results (where each chunk
   landed) and commits ``.metadata``; any rank's failure is every rank's ``CheckpointException``.
"""

from __future__ import annotations

import os

from ._storage_utils import _storage_setup, _use_dist
from .default_planner import DefaultSavePlanner
from .metadata import STATE_DICT_TYPE, Metadata
from .planner import SavePlanner
from .stateful import Stateful
from .storage import StorageWriter
from .utils import _DistWrapper

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


def _save_state_dict(state_dict, storage_writer, process_group=None, coordinator_rank: int = 0,
                     no_dist: bool = False, planner: SavePlanner | None = None) -> Metadata:
    dist = _DistWrapper(process_group, not no_dist, coordinator_rank)
    planner = planner or DefaultSavePlanner()
    global_metadata = None

    def local_step():
        planner.set_up_planner(state_dict=state_dict, storage_meta=storage_writer.storage_meta(),
                               is_coordinator=dist.is_coordinator)
        storage_writer.set_up_storage_writer(dist.is_coordinator, rank=dist.rank, use_collectives=True)
        return storage_writer.prepare_local_plan(planner.create_local_plan())

    def global_step(all_local_plans):
        nonlocal global_metadata
        all_local_plans, global_metadata = planner.create_global_plan(all_local_plans)
        return storage_writer.prepare_global_plan(all_local_plans)

    central_plan = dist.reduce_scatter("plan", local_step, global_step)

    def write_data():
        writes = storage_writer.write_data(planner.finish_plan(central_plan), planner)
        writes.wait()
        return writes.value()

    def finish_checkpoint(all_results):
        storage_writer.finish(metadata=global_metadata, results=all_results)
        return global_metadata

    return dist.all_reduce("write", write_data, finish_checkpoint)
