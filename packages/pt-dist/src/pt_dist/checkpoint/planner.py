"""The planning protocol (torch/distributed/checkpoint/planner.py): a save is a list of ``WriteItem`` per rank
(``SavePlan``), a load a list of ``ReadItem`` (``LoadPlan``); a ``SavePlanner`` / ``LoadPlanner`` makes them.

The order of calls, on every rank unless noted: ``set_up_planner`` -> ``create_local_plan`` -> (coordinator only)
``create_global_plan`` over all ranks' plans -> ``finish_plan`` with this rank's part of the global plan -> then,
while the storage layer writes, ``resolve_data`` per item (save) or ``load_bytes`` / ``resolve_tensor`` /
``commit_tensor`` per item (load).
"""

from __future__ import annotations

import abc
import io
import math
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

import torch

from .metadata import STATE_DICT_TYPE, ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta, TensorProperties

__all__ = ["BytesIOWriteData", "LoadItemType", "LoadPlan", "LoadPlanner", "ReadItem", "SavePlan", "SavePlanner",
           "TensorWriteData", "WriteItem", "WriteItemType"]


class WriteItemType(Enum):
    TENSOR = auto()  # a whole plain tensor (every rank may hold it: deduplicated)
    SHARD = auto()  # one chunk of a sharded tensor (a DTensor's local part)
    BYTE_IO = auto()  # any other object, pickled


class LoadItemType(Enum):
    TENSOR = auto()
    BYTE_IO = auto()


@dataclass(frozen=True)
class BytesIOWriteData:
    nbytes: int


@dataclass(frozen=True)
class TensorWriteData:
    chunk: ChunkStorageMetadata
    properties: TensorProperties
    size: torch.Size  # the global tensor's


@dataclass(frozen=True)
class WriteItem:
    index: MetadataIndex
    type: WriteItemType
    bytes_io_data: BytesIOWriteData | None = None
    tensor_data: TensorWriteData | None = None

    def tensor_storage_size(self) -> int | None:
        """Bytes of the (global) tensor, or None for a bytes item: the weight dedup balances ranks by (torch's)."""
        if self.tensor_data is None:
            return None
        return math.prod(self.tensor_data.size) * self.tensor_data.properties.dtype.itemsize


@dataclass(frozen=True)
class ReadItem:
    """Copy ``lengths`` starting at ``storage_offsets`` of the saved chunk ``storage_index`` to ``dest_offsets``
    of the local tensor ``dest_index`` (offsets relative to each chunk)."""

    type: LoadItemType
    dest_index: MetadataIndex
    dest_offsets: torch.Size
    storage_index: MetadataIndex
    storage_offsets: torch.Size
    lengths: torch.Size


@dataclass(frozen=True)
class SavePlan:
    items: list[WriteItem]
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass
class LoadPlan:
    items: list[ReadItem]
    storage_data: Any = None
    planner_data: Any = None


class SavePlanner(abc.ABC):
    @abc.abstractmethod
    def set_up_planner(self, state_dict: STATE_DICT_TYPE, storage_meta: StorageMeta | None = None,
                       is_coordinator: bool = False) -> None: ...

    @abc.abstractmethod
    def create_local_plan(self) -> SavePlan: ...

    @abc.abstractmethod
    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]: ...

    @abc.abstractmethod
    def finish_plan(self, new_plan: SavePlan) -> SavePlan: ...

    @abc.abstractmethod
    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO: ...


class LoadPlanner(abc.ABC):
    @abc.abstractmethod
    def set_up_planner(self, state_dict: STATE_DICT_TYPE, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None: ...

    @abc.abstractmethod
    def create_local_plan(self) -> LoadPlan: ...

    @abc.abstractmethod
    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]: ...

    @abc.abstractmethod
    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan: ...

    @abc.abstractmethod
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None: ...

    def resolve_bytes(self, read_item: ReadItem) -> io.BytesIO:
        """The BytesIO a storage reader fills for ``read_item`` (optional, as torch's: not implemented by default)."""
        raise NotImplementedError("LoadPlanner.resolve_bytes is not implemented")

    @abc.abstractmethod
    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor: ...

    @abc.abstractmethod
    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None: ...
