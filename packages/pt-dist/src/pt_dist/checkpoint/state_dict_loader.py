"""``load`` (torch/distributed/checkpoint/state_dict_loader.py), in place: every rank reads ``.metadata``, plans
the reads that fill *its* state dict's tensors (the overlaps of its chunks with the saved ones), and reads them;
the plan step and the read step each end in a collective, so a rank's failure (a missing or corrupt file, a
missing key, a size mismatch) is every rank's ``CheckpointException``."""

from __future__ import annotations

import os

from ._storage_utils import _storage_setup, _use_dist
from .default_planner import DefaultLoadPlanner
from .metadata import STATE_DICT_TYPE
from .planner import LoadPlanner
from .stateful import Stateful
from .storage import StorageReader
from .utils import _DistWrapper

__all__ = ["load"]


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


def _load_state_dict(state_dict, storage_reader, process_group=None, coordinator_rank: int = 0,
                     no_dist: bool = False, planner: LoadPlanner | None = None) -> None:
    dist = _DistWrapper(process_group, not no_dist, coordinator_rank)
    planner = planner or DefaultLoadPlanner()

    def local_step():
        metadata = storage_reader.read_metadata()
        planner.set_up_planner(state_dict, metadata, dist.is_coordinator)
        storage_reader.set_up_storage_reader(metadata, dist.is_coordinator, rank=dist.rank, use_collectives=True)
        return storage_reader.prepare_local_plan(planner.create_local_plan())

    def global_step(all_local_plans):
        return storage_reader.prepare_global_plan(planner.create_global_plan(all_local_plans))

    central_plan = dist.reduce_scatter("plan", local_step, global_step)

    def read_data():
        reads = storage_reader.read_data(planner.finish_plan(central_plan), planner)
        reads.wait()

    dist.all_gather("read", read_data)
