"""The storage layer (torch/distributed/checkpoint/storage.py and filesystem.py): the protocol, a
``StorageWriter`` that prepares plans, writes one rank's items and, on the coordinator, commits the metadata
(``finish``), a ``StorageReader`` that reads the metadata and one rank's items; and the file-system storage.

``FileSystemWriter`` writes each rank's items into ``__<rank>_<save token>_<n>.distcp`` files (each tensor chunk
a ``torch.save`` blob, each object its pickled bytes, at a byte offset), then the coordinator writes
``.metadata``: the pickled ``Metadata`` with, per chunk, its file, offset and length (``_StorageInfo``), and per
file its size and CRC-32. Atomic: data files never reuse a name (the save's token is in it), every file is
fsynced, and ``.metadata`` is written to a temporary name and renamed over the old one only after every rank's
data is on disk (``pt_dist/_infra/atomic_io.py``). So a save killed at any point leaves the previous checkpoint in
the directory as it was; the commit then removes data files no checkpoint references. ``FileSystemReader`` reads
a file where it lies; a missing, truncated or altered data file is an error naming it. ``.metadata`` is written
in ``METADATA_FORMAT``, which ``pt_dist/_compat/checkpoint/torch_format.py`` makes torch's, so torch's
``dcp.load`` reads a pt_dist checkpoint and pt_dist reads torch's.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.futures import Future

from pt_dist._infra import renamed_pickle
from pt_dist._infra.atomic_io import BufferView, DurableFile, atomic_write, fsync_dir, read_checked

from . import metadata as md
from .metadata import Metadata, MetadataIndex, StorageMeta
from .planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem, WriteItemType
from .utils import narrow_tensor_by_index

__all__ = ["FileSystemReader", "FileSystemWriter", "StorageReader", "StorageWriter", "WriteResult"]


@dataclass(frozen=True)
class WriteResult:
    index: MetadataIndex
    size_in_bytes: int
    storage_data: Any


class StorageWriter(abc.ABC):
    @abc.abstractmethod
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None: ...

    @abc.abstractmethod
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None: ...

    @abc.abstractmethod
    def prepare_local_plan(self, plan: SavePlan) -> SavePlan: ...

    @abc.abstractmethod
    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]: ...

    @abc.abstractmethod
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]: ...

    @abc.abstractmethod
    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None: ...

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool: ...

    def storage_meta(self) -> StorageMeta | None:
        return None


class StorageReader(abc.ABC):
    @abc.abstractmethod
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None: ...

    @abc.abstractmethod
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata: ...

    @abc.abstractmethod
    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None: ...

    @abc.abstractmethod
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan: ...

    @abc.abstractmethod
    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]: ...

    @abc.abstractmethod
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]: ...

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool: ...


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


@dataclass
class _StoragePrefix:
    prefix: str


# How ``.metadata`` names and encodes its classes (``pt_dist/_infra/renamed_pickle.py``): as they are, until
# ``pt_dist/_compat/checkpoint/torch_format.py`` makes it torch's names and encodings (pt_dist.checkpoint imports it)
METADATA_FORMAT: dict = {"names": {cls: (cls.__module__, cls.__qualname__) for cls in (
    md.BytesStorageMetadata, md.ChunkStorageMetadata, md.Metadata, md.MetadataIndex, md.StorageMeta,
    md.TensorProperties, md.TensorStorageMetadata, _StorageInfo)}, "states": {}, "classes": {}}


class FileSystemWriter(StorageWriter):
    """Each rank's items in ``__<rank>_<save token>_0.distcp`` under ``path``, the metadata committed atomically
    (``finish``); with ``sync_files`` every file and the directory are fsynced; ``overwrite=False`` refuses a
    directory that holds a checkpoint. torch's options (several files per rank, writer threads) are
    ``pt_dist/_compat/checkpoint/filesystem.py``'s, which splits the items through ``_buckets`` and
    ``_write_files``."""

    def __init__(self, path: str | os.PathLike, sync_files: bool = True, overwrite: bool = True) -> None:
        self.path, self.sync_files, self.overwrite = Path(path), sync_files, overwrite
        self.save_id, self.rank = str(uuid.uuid4()), None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank, self.is_coordinator = kwargs.get("rank"), is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / _metadata_fn).exists() and not self.overwrite:
            raise RuntimeError(f"Checkpoint already exists and self.overwrite={self.overwrite}.")
        return plan  # (an existing checkpoint stays loadable until this save commits)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        token = self.save_id.split("-")[0]  # (the coordinator's: one token names every rank's files)
        return [dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_{token}_")) if p.storage_data is None
                else p for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results = self._write_files(self._buckets(plan), planner)
        if self.sync_files:
            fsync_dir(self.path)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _buckets(self, plan: SavePlan) -> list[tuple[str, list[WriteItem]]]:
        """The files this rank writes, each with its items: one file."""
        return [(f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}", plan.items)]

    def _write_files(self, buckets: list[tuple[str, list[WriteItem]]], planner: SavePlanner) -> list[WriteResult]:
        return [wr for name, items in buckets for wr in self._write_file(name, items, planner)]

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        """Bytes items first, then tensors (torch's order); the last result carries the file's size and CRC."""
        out = []
        with DurableFile(self.path / name, sync=self.sync_files) as f:
            for item in sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO):
                data = planner.resolve_data(item)
                if item.type != WriteItemType.BYTE_IO:
                    tensor = data.detach().cpu()
                    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
                        tensor = tensor.clone()  # a view: save its elements, not the storage it looks into
                    data = io.BytesIO()
                    torch.save(tensor, data)
                blob = data.getbuffer()
                out.append(WriteResult(index=item.index, size_in_bytes=len(blob),
                                       storage_data=_StorageInfo(name, f.write(blob), len(blob))))
        out.append(WriteResult(index=None, size_in_bytes=f.size, storage_data=(_FILES_KEY, name, f.size, f.crc)))
        return out

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit (coordinator): ``.metadata`` written aside, fsynced, renamed into place; then stale files go."""
        storage_md, files = {}, {}
        for wr in (wr for rank in results for wr in rank):
            if wr.index is None:  # a file's (_FILES_KEY, name, size, crc)
                files[wr.storage_data[1]] = wr.storage_data[2:]
            else:
                storage_md[wr.index] = wr.storage_data
        storage_md[_FILES_KEY] = files
        metadata.version, metadata.storage_data = CURRENT_DCP_VERSION, storage_md
        metadata.storage_meta = self.storage_meta()
        data = renamed_pickle.dumps(metadata, METADATA_FORMAT["names"], METADATA_FORMAT["states"])
        atomic_write(self.path / _metadata_fn, data, sync=self.sync_files)
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


def _validate_path(checkpoint_id) -> bool:
    if isinstance(checkpoint_id, Path):
        return True
    if "://" in str(checkpoint_id):
        return False
    return any(p.exists() and os.access(p, os.W_OK) for p in Path(checkpoint_id).parents)


class FileSystemReader(StorageReader):
    def __init__(self, path: str | os.PathLike, _extension_registry=None) -> None:
        if _extension_registry is not None:
            raise ValueError("FileSystemReader: stream extensions are not supported")
        self.path, self.storage_data, self.load_id = Path(path), {}, str(uuid.uuid4())

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self.path / _metadata_fn
        if not path.exists():
            raise FileNotFoundError(f"no complete checkpoint at {self.path}: {_metadata_fn} missing (a save that "
                                    f"never finished?)")
        metadata = renamed_pickle.loads(path.read_bytes(), METADATA_FORMAT["names"], METADATA_FORMAT["classes"])
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = dict(metadata.storage_data)
        self._files = self.storage_data.pop(_FILES_KEY, None)  # (None: a checkpoint torch wrote)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """File by file: each item's blob is read where it lies in the mapped file, narrowed to the requested
        box and copied into the tensor the planner resolves."""
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
                tensor = torch.load(BufferView(piece), map_location="cpu", weights_only=True)
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
        if self._files is not None and name not in self._files:
            raise ValueError(f"checkpoint data file {path} has no checksum in {_metadata_fn}")
        return read_checked(path, "checkpoint data file", None if self._files is None else self._files[name])

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _validate_path(checkpoint_id)
