"""A save and a load over a given storage and planner (torch's ``checkpoint/state_dict_saver.py``
``_save_state_dict`` and ``state_dict_loader.py`` ``_load_state_dict``, which torch's ``_checkpointer.py`` wraps;
``pt_dist.checkpoint.save`` / ``load`` with torch's arguments are in ``pt_dist/_compat/checkpoint/``).

Save, two collective steps over the group (``utils._DistWrapper``):

1. plan (``reduce_scatter``): every rank makes its local plan, the coordinator gathers them, dedups and builds
   the ``Metadata``, and scatters each rank its part;
2. write (``all_reduce``): every rank writes its items, the coordinator gathers the results (where each chunk
   landed) and commits ``.metadata``.

Load, two steps: plan (every rank reads ``.metadata`` and plans the reads that fill *its* tensors: the overlaps
of its chunks with the saved ones) and read (``all_gather``). Any rank's failure in a step is every rank's
``CheckpointException``.
"""

from __future__ import annotations

from .default_planner import DefaultLoadPlanner, DefaultSavePlanner
from .metadata import STATE_DICT_TYPE, Metadata
from .planner import LoadPlanner, SavePlanner
from .storage import StorageReader, StorageWriter
from .utils import _DistWrapper

__all__ = ["_load_state_dict", "_save_state_dict"]


def _save_state_dict(state_dict: STATE_DICT_TYPE, storage_writer: StorageWriter, process_group=None,
                     coordinator_rank: int = 0, no_dist: bool = False, planner: SavePlanner | None = None
                     ) -> Metadata:
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


def _load_state_dict(state_dict: STATE_DICT_TYPE, storage_reader: StorageReader, process_group=None,
                     coordinator_rank: int = 0, no_dist: bool = False, planner: LoadPlanner | None = None) -> None:
    """Fills ``state_dict``'s tensors (and DTensors' local parts) in place; other values are replaced."""
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
