"""What a checkpoint holds (torch/distributed/checkpoint/metadata.py): per state-dict key, a tensor's global size,
dtype and the chunks (offsets, sizes) it was saved in, or a bytes entry for any other object.

The field names are torch's, and the ``.metadata`` file stores these classes under torch's module paths and
encodings (``pt_dist/_compat/checkpoint/torch_format.py``), so a checkpoint written here is torch's format and
torch's is ours.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BytesStorageMetadata", "ChunkStorageMetadata", "Metadata", "MetadataIndex", "StorageMeta",
           "TensorProperties", "TensorStorageMetadata"]


@dataclass
class ChunkStorageMetadata:
    """One saved block of a tensor: where it starts in the global tensor and its size (every dim)."""

    offsets: torch.Size
    sizes: torch.Size


@dataclass
class TensorProperties:
    """How to rebuild a tensor: its dtype (the other fields are torch's, kept for its format)."""

    dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
    layout: torch.layout = field(default=torch.strided)
    requires_grad: bool = False
    memory_format: torch.memory_format = field(default=torch.contiguous_format)
    pin_memory: bool = False
    strides: tuple[int, ...] | None = None

    @staticmethod
    def create_from_tensor(tensor: torch.Tensor) -> TensorProperties:
        return TensorProperties(dtype=tensor.dtype, layout=tensor.layout, requires_grad=tensor.requires_grad,
                                pin_memory=tensor.device.type == "cpu" and tensor.is_pinned(),
                                strides=tuple(tensor.stride()))


@dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    pass


STORAGE_TYPES = TensorStorageMetadata | BytesStorageMetadata
STATE_DICT_TYPE = dict[str, Any]


@dataclass
class StorageMeta:
    checkpoint_id: str | os.PathLike | None = None
    save_id: str | None = None
    load_id: str | None = None
    modules: list[str] = field(default_factory=list)


@dataclass
class Metadata:
    """The whole checkpoint's description: ``state_dict_metadata`` (key -> storage type), the planner's data
    (the nested-dict paths of flattened keys) and the storage's (where each chunk lies, the files' checksums)."""

    state_dict_metadata: dict[str, STORAGE_TYPES]
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: StorageMeta | None = None
    version: str | None = None


@dataclass(frozen=True)
class MetadataIndex:
    """A key in the state dict and, for a tensor, the offset of one chunk; ``index`` is a lookup hint only."""

    fqn: str
    offset: torch.Size | None = None
    index: int | None = field(hash=False, compare=False, default=None)

    def __init__(self, fqn: str, offset: Sequence[int] | None = None, index: int | None = None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "offset", None if offset is None else torch.Size(offset))
        object.__setattr__(self, "index", index)
