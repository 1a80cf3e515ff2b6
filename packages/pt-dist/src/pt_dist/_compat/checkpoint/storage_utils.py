"""Which storage a ``checkpoint_id`` means (torch's checkpoint/_storage_utils.py): a path -> the file system;
and whether a save or load is collective (one process when pt_dist is not initialised, as torch's)."""

from __future__ import annotations

import logging

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.checkpoint.filesystem import FileSystemWriter
from pt_dist.checkpoint.storage import FileSystemReader


def _storage_setup(storage, checkpoint_id, reader: bool = False):
    if storage is not None:
        storage.reset(checkpoint_id)  # (with None too: a reused writer gets a fresh save id, so fresh file names)
        return storage
    if not checkpoint_id:
        raise RuntimeError("`checkpoint_id` must be specified if storage_reader/storage_writer is None.")
    target = FileSystemReader if reader else FileSystemWriter
    if target.validate_checkpoint_id(checkpoint_id):
        storage = target(checkpoint_id)
        storage.reset(checkpoint_id)
        return storage
    raise RuntimeError(f"Cannot detect which StorageReader or StorageWriter to use for checkpoint_id "
                       f"{checkpoint_id!r} (not a path with a writable parent). Please specify the "
                       f"storage_reader/storage_writer.")


def _use_dist(no_dist: bool, op: str) -> bool:
    if no_dist:
        return False
    if not c10d.is_initialized():
        logging.getLogger(__name__).warning("pt_dist is not initialized: assuming the intent is to %s in a single "
                                            "process.", op)
        return False
    return True
