"""Checkpoints in a directory (torch/distributed/checkpoint/filesystem.py): each rank writes its items into
``__<rank>_<save token>_<n>.distcp`` files (each tensor chunk a ``torch.save`` blob, each object its pickled
bytes, at a byte offset), then the coordinator writes ``.metadata``: the pickled ``Metadata`` with, per chunk,
its file, offset and length (``_StorageInfo``), and per file its size and CRC-32.

Atomic: data files never reuse a name (the save's token is in it), every file is fsynced, and ``.metadata`` is
written to a temporary name and renamed over the old one only after every rank's data is on disk. So a save
killed at any point leaves the previous checkpoint in the directory as it was; the commit then removes data
files no checkpoint references. A missing, truncated or altered data file is an error naming it.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import mmap
import os
import queue
import threading
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch.futures import Future

from . import _metadata_pickle
from .metadata import Metadata, StorageMeta
from .planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem, WriteItemType
from .storage import StorageReader, StorageWriter, WriteResult
from .utils import narrow_tensor_by_index

logger = logging.getLogger(__name__)

__all__ = ["FileSystemReader", "FileSystemWriter", "SerializationFormat"]

_metadata_fn = ".metadata"
CURRENT_DCP_VERSION = "1.0.0"
DEFAULT_SUFFIX = ".distcp"
_FILES_KEY = "pt_dist_files"  # storage_data's entry {file: (size, crc32)}; torch's reader only looks up chunks


@dataclass
class _StorageInfo:
    """Where one chunk lies: ``length`` bytes at ``offset`` of ``relative_path`` (torch's, field for field)."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: Sequence[str] | None = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class _StoragePrefix:
    prefix: str


class SerializationFormat(Enum):
    TORCH_SAVE = "torch_save"
    SAFETENSORS = "safetensors"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the directory entries (new names, the rename) survive a crash too
    finally:
        os.close(fd)


class FileSystemWriter(StorageWriter):
    def __init__(self, path: str | os.PathLike, single_file_per_rank: bool = True, sync_files: bool = True,
                 thread_count: int = 1, per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True, _extensions=None,
                 serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE) -> None:
        """``per_thread_copy_ahead`` is how far torch copies GPU tensors ahead of writing; here each tensor is
        copied to the CPU when its turn comes, so it changes nothing."""
        if thread_count < 1:
            raise ValueError(f"FileSystemWriter: thread_count must be >= 1, got {thread_count}")
        if cache_staged_state_dict:
            raise ValueError("FileSystemWriter: cache_staged_state_dict=True (async_save's staging) is not supported")
        if _extensions:
            raise ValueError(f"FileSystemWriter: stream extensions are not supported, got {_extensions!r}")
        if serialization_format is not SerializationFormat.TORCH_SAVE:
            raise ValueError(f"FileSystemWriter: only SerializationFormat.TORCH_SAVE is supported, got "
                             f"{serialization_format!r}")
        self.path = Path(path)
        self.single_file_per_rank, self.sync_files, self.thread_count = single_file_per_rank, sync_files, thread_count
        self.per_thread_copy_ahead, self.overwrite = per_thread_copy_ahead, overwrite
        self.serialization_format = serialization_format
        self.save_id = str(uuid.uuid4())
        self.rank: int | None = None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank, self.is_coordinator = kwargs.get("rank"), is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / _metadata_fn).exists():
            if not self.overwrite:
                raise RuntimeError(f"Checkpoint already exists and self.overwrite={self.overwrite}.")
            logger.info("replacing the checkpoint in %s (it stays loadable until this save commits)", self.path)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        token = self.save_id.split("-")[0]  # (the coordinator's: one token names every rank's files)
        return [dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_{token}_")) if p.storage_data is None
                else p for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data.prefix
        if self.single_file_per_rank:
            buckets = _split_by_size(self.thread_count, plan.items)
        else:
            buckets = [[item] for item in plan.items]
        jobs = [(f"{prefix}{n}{DEFAULT_SUFFIX}", bucket) for n, bucket in enumerate(buckets)]
        results: list = [None] * len(jobs)
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for k in range(len(jobs)):
            pending.put(k)

        def worker() -> None:  # (thread_count files at a time; this thread is one of the writers)
            while True:
                try:
                    k = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[k] = self._write_file(*jobs[k], planner)
                except BaseException as e:  # (re-raised below, in the calling thread)
                    results[k] = e

        threads = [threading.Thread(target=worker) for _ in range(min(self.thread_count, len(jobs)) - 1)]
        for t in threads:
            t.start()
        worker()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        if self.sync_files and jobs:
            _fsync_dir(self.path)
        fut: Future = Future()
        fut.set_result([wr for rs in results for wr in rs])
        return fut

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        """Bytes items first, then tensors (torch's order); the last result carries the file's size and CRC."""
        out, offset, crc = [], 0, 0
        with open(self.path / name, "wb") as f:
            for item in sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO):
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    blob = data.getbuffer()
                else:
                    tensor = data.detach().cpu()
                    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
                        tensor = tensor.clone()  # a view: save its elements, not the storage it looks into
                    buf = io.BytesIO()
                    torch.save(tensor, buf)
                    blob = buf.getbuffer()
                f.write(blob)
                crc = zlib.crc32(blob, crc)
                out.append(WriteResult(index=item.index, size_in_bytes=len(blob),
                                       storage_data=_StorageInfo(name, offset, len(blob))))
                offset += len(blob)
            if self.sync_files:
                f.flush()
                os.fsync(f.fileno())
        out.append(WriteResult(index=None, size_in_bytes=offset, storage_data=(_FILES_KEY, name, offset, crc)))
        return out

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit (coordinator): ``.metadata`` written aside, fsynced, renamed into place; then stale files go."""
        storage_md, files = {}, {}
        for wr in (wr for rank in results for wr in rank):
            if wr.index is None and isinstance(wr.storage_data, tuple) and wr.storage_data[0] == _FILES_KEY:
                files[wr.storage_data[1]] = wr.storage_data[2:]
            else:
                storage_md[wr.index] = wr.storage_data
        storage_md[_FILES_KEY] = files
        metadata.version, metadata.storage_data, metadata.storage_meta = CURRENT_DCP_VERSION, storage_md, \
            self.storage_meta()
        tmp = self.path / f"{_metadata_fn}.{self.save_id}.tmp"
        with open(tmp, "wb") as f:
            f.write(_metadata_pickle.dumps(metadata))
            if self.sync_files:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path / _metadata_fn)
        if self.sync_files:
            _fsync_dir(self.path)
        live = {info.relative_path for k, info in storage_md.items() if k != _FILES_KEY} | set(files)
        for stale in self.path.iterdir():
            if (stale.name.startswith("__") and stale.name.endswith(DEFAULT_SUFFIX) and stale.name not in live) or (
                    stale.name.startswith(f"{_metadata_fn}.") and stale.name.endswith(".tmp")):
                stale.unlink(missing_ok=True)  # an earlier save's files, or a killed save's

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _validate_path(checkpoint_id)


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


def _validate_path(checkpoint_id) -> bool:
    if isinstance(checkpoint_id, Path):
        return True
    if "://" in str(checkpoint_id):
        return False
    return any(p.exists() and os.access(p, os.W_OK) for p in Path(checkpoint_id).parents)


class _BufferView(io.RawIOBase):
    """A read-only, seekable file over a slice of the mapped file: ``torch.load`` reads a blob where it lies."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos: self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence] + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class FileSystemReader(StorageReader):
    def __init__(self, path: str | os.PathLike, _extension_registry=None) -> None:
        if _extension_registry is not None:
            raise ValueError("FileSystemReader: stream extensions are not supported")
        self.path = Path(path)
        self.storage_data: dict = {}
        self.load_id = str(uuid.uuid4())

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self.path / _metadata_fn
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"no complete checkpoint at {self.path}: {_metadata_fn} missing (a save that "
                                    f"never finished?)") from None
        metadata = _metadata_pickle.loads(data)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise AssertionError("storage_data must not be None in metadata")
        self.storage_data = dict(metadata.storage_data)
        self._files = self.storage_data.pop(_FILES_KEY, None)  # (None: a checkpoint torch wrote)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            blob = self._read_file(name)
            for req in items:
                info = self.storage_data[req.storage_index]
                piece = blob[info.offset: info.offset + info.length]
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(piece))  # (a copy: a planner may keep or getvalue() it)
                    continue
                piece = _BufferView(piece)
                tensor = torch.load(piece, map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
                target.copy_(tensor)
                planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_file(self, name: str) -> memoryview:
        """The whole data file, mapped, checked against the size and CRC-32 the save recorded."""
        path = self.path / name
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"checkpoint data file {path} is missing") from None
        with f:
            size_on_disk = os.fstat(f.fileno()).st_size
            blob = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size_on_disk else b"")
        if self._files is not None:
            if name not in self._files:
                raise ValueError(f"checkpoint data file {path} has no checksum in {_metadata_fn}")
            size, crc = self._files[name]
            if len(blob) != size:
                raise ValueError(f"checkpoint data file {path} is corrupt: {len(blob)} bytes, the save wrote {size}")
            if zlib.crc32(blob) != crc:
                raise ValueError(f"checkpoint data file {path} is corrupt: its CRC-32 differs from the save's")
        return blob

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _validate_path(checkpoint_id)
