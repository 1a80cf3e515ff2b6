"""``save`` with torch's arguments (torch/distributed/checkpoint/state_dict_saver.py): the storage a
``checkpoint_id`` names, ``Stateful`` values saved as their ``state_dict()``, one process when pt_dist is not
initialised; then the core's save (``pt_dist/checkpoint/_checkpointer.py``). ``async_save``: stage a CPU copy
(staging.py), then ``save`` it on a thread of its own; the deprecated ``save_state_dict``."""

from __future__ import annotations

import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from pt_dist._compat.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from pt_dist._compat.checkpoint.storage_utils import _storage_setup, _use_dist
from pt_dist.checkpoint._checkpointer import _save_state_dict
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE, Metadata
from pt_dist.checkpoint.planner import SavePlanner
from pt_dist.checkpoint.stateful import Stateful
from pt_dist.checkpoint.storage import StorageWriter

__all__ = ["AsyncCheckpointerType", "AsyncSaveResponse", "async_save", "save", "save_state_dict"]


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



class AsyncCheckpointerType(Enum):
    """Where ``async_save`` writes: a thread (a separate process is not supported here)."""

    THREAD = "thread"
    PROCESS = "process"


@dataclass
class AsyncSaveResponse:
    """What ``async_save`` returns when staging is itself asynchronous: when the copy is done, when the save is."""

    staging_completion: Future
    upload_completion: Future


def save_state_dict(state_dict: STATE_DICT_TYPE, storage_writer: StorageWriter, process_group=None,
                    coordinator_rank: int = 0, no_dist: bool = False, planner: SavePlanner | None = None) -> Metadata:
    """Deprecated: torch's former ``save`` (no ``Stateful`` handling, an explicit coordinator rank)."""
    warnings.warn("`save_state_dict` is deprecated and will be removed in future versions.Please use `save` "
                  "instead.", FutureWarning, stacklevel=2)
    storage_writer.reset()
    return _save_state_dict(state_dict, storage_writer, process_group, coordinator_rank, no_dist, planner)


def async_save(state_dict: STATE_DICT_TYPE, *, checkpoint_id: str | os.PathLike | None = None,
               storage_writer: StorageWriter | None = None, planner: SavePlanner | None = None, process_group=None,
               async_checkpointer_type: AsyncCheckpointerType = AsyncCheckpointerType.THREAD,
               async_stager: AsyncStager | None = None, no_dist: bool = False,
               use_collectives: bool = True) -> Future | AsyncSaveResponse:
    """Copy ``state_dict`` to CPU memory (the ``async_stager``, else ``storage_writer`` when it stages, else a
    ``DefaultStager``), then ``save`` the copy on a thread; returns a ``Future`` of the ``Metadata`` (an
    ``AsyncSaveResponse`` when the stager's copy is itself a ``Future``). The save's collectives run on that
    thread: give it a ``process_group`` no other thread uses meanwhile (``pt_dist.new_group()``)."""
    if not isinstance(async_checkpointer_type, AsyncCheckpointerType):
        raise TypeError(f"async_save: async_checkpointer_type must be an AsyncCheckpointerType, got "
                        f"{async_checkpointer_type!r}")
    if async_checkpointer_type is AsyncCheckpointerType.PROCESS:
        raise ValueError("async_save: AsyncCheckpointerType.PROCESS (a checkpointing process) is not supported by "
                         "pt_dist; use AsyncCheckpointerType.THREAD")
    owned = None
    if async_stager is None:
        if isinstance(storage_writer, AsyncStager):
            async_stager = storage_writer
        else:
            async_stager = owned = DefaultStager(StagingOptions(False, False, False, False))
    state_dict = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
    staged = async_stager.stage(state_dict)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="AsyncCheckpointExecutor")

    def upload():
        return save(staged.result() if isinstance(staged, Future) else staged, checkpoint_id=checkpoint_id,
                    storage_writer=storage_writer, planner=planner, process_group=process_group, no_dist=no_dist,
                    use_collectives=use_collectives)

    upload_future = executor.submit(upload)
    upload_future.add_done_callback(lambda _: executor.shutdown(wait=False))
    if owned is not None:
        upload_future.add_done_callback(lambda _: owned.close())
    if isinstance(staged, Future):
        staging_done: Future = Future()

        def copied(f: Future) -> None:
            if f.exception() is not None:
                staging_done.set_exception(f.exception())
            else:
                staging_done.set_result(None)

        staged.add_done_callback(copied)
        return AsyncSaveResponse(staging_completion=staging_done, upload_completion=upload_future)
    if async_stager.should_synchronize_after_execute:
        async_stager.synchronize_staging()
    return upload_future
