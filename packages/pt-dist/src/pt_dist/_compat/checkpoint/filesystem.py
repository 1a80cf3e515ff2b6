"""torch's ``FileSystemWriter`` options over the core's (``pt_dist/checkpoint/storage.py``): ``thread_count``
files per rank of about equal size (or one per item without ``single_file_per_rank``) written that many at a time;
``per_thread_copy_ahead`` accepted (torch copies GPU tensors that far ahead; here each is copied to the CPU in its
turn, so it changes nothing); ``stage`` (it is a ``BlockingAsyncStager``, as torch's: ``async_save`` stages
through it, into one kept copy with ``cache_staged_state_dict``); stream extensions and safetensors refused."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

from pt_dist._compat.checkpoint.staging import BlockingAsyncStager
from pt_dist.checkpoint import storage
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE
from pt_dist.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from pt_dist.checkpoint.storage import DEFAULT_SUFFIX, WriteResult

__all__ = ["FileSystemWriter", "SerializationFormat"]


class SerializationFormat(Enum):
    TORCH_SAVE = "torch_save"
    SAFETENSORS = "safetensors"


class FileSystemWriter(storage.FileSystemWriter, BlockingAsyncStager):
    def __init__(self, path: str | os.PathLike, single_file_per_rank: bool = True, sync_files: bool = True,
                 thread_count: int = 1, per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True, _extensions=None,
                 serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE) -> None:
        if thread_count < 1 or _extensions or serialization_format is not SerializationFormat.TORCH_SAVE:
            raise ValueError(f"FileSystemWriter: not supported: thread_count={thread_count}, _extensions="
                             f"{_extensions!r}, serialization_format={serialization_format!r} (TORCH_SAVE only)")
        super().__init__(path, sync_files=sync_files, overwrite=overwrite)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict)
        self.single_file_per_rank, self.thread_count = single_file_per_rank, thread_count
        self.per_thread_copy_ahead, self.serialization_format = per_thread_copy_ahead, serialization_format

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        """A CPU copy of ``state_dict`` for ``async_save`` (torch's: then nothing is copied ahead while writing)."""
        self.per_thread_copy_ahead = 0
        return super().stage(state_dict)

    def _buckets(self, plan: SavePlan) -> list[tuple[str, list[WriteItem]]]:
        buckets = _split_by_size(self.thread_count, plan.items) if self.single_file_per_rank else \
            [[item] for item in plan.items]
        return [(f"{plan.storage_data.prefix}{n}{DEFAULT_SUFFIX}", bucket) for n, bucket in enumerate(buckets)]

    def _write_files(self, buckets, planner: SavePlanner) -> list[WriteResult]:
        if self.thread_count == 1 or len(buckets) == 1:
            return super()._write_files(buckets, planner)  # (on this thread)
        with ThreadPoolExecutor(min(self.thread_count, len(buckets))) as pool:
            return [wr for rs in pool.map(lambda b: self._write_file(*b, planner), buckets) for wr in rs]


def _split_by_size(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """``bins`` files of about equal size (bytes items dealt round, tensors largest first to the lightest)."""
    if bins == 1:
        return [items]
    buckets, sizes = [[] for _ in range(bins)], [0] * bins
    for i, item in enumerate(i for i in items if i.type == WriteItemType.BYTE_IO):
        buckets[i % bins].append(item)
    tensors = [i for i in items if i.type != WriteItemType.BYTE_IO]
    for item in sorted(tensors, key=lambda i: i.tensor_storage_size(), reverse=True):
        k = sizes.index(min(sizes))
        buckets[k].append(item)
        sizes[k] += item.tensor_storage_size()
    return [b for b in buckets if b] or [[]]
