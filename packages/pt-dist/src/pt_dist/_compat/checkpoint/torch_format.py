"""torch's ``.metadata`` format: the checkpoint's classes pickled under torch's module paths
(``torch.distributed.checkpoint.metadata``, ``...filesystem._StorageInfo``) and with torch's encodings (a
``TensorProperties`` as its state tuple, the memory format as torch's ``_MEM_FORMAT_ENCODING``; a
``_StorageInfo`` without its None fields), so torch's ``dcp.load`` reads a pt_dist checkpoint as its own and
pt_dist reads torch's, neither importing the other. Importing this installs it in the core's
``storage.METADATA_FORMAT`` (``pt_dist.checkpoint`` does)."""

from __future__ import annotations

from enum import Enum

import torch

from pt_dist.checkpoint import storage
from pt_dist.checkpoint.metadata import TensorProperties

_TORCH = "torch.distributed.checkpoint"


class _MEM_FORMAT_ENCODING(Enum):  # noqa: N801 - torch's name, which the file records
    """How torch's ``TensorProperties.__getstate__`` records the memory format."""

    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


_ENCODE = {torch.contiguous_format: _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
           torch.channels_last: _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST,
           torch.preserve_format: _MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT}
_DECODE = {code: fmt for fmt, code in _ENCODE.items()}


def _properties_state(p: TensorProperties) -> tuple:
    return p.dtype, p.layout, p.requires_grad, _ENCODE[p.memory_format], p.pin_memory, p.strides


class _TorchTensorProperties(TensorProperties):
    """What torch's ``TensorProperties`` name loads as: its state tuple decoded, the object then the core's class."""

    def __setstate__(self, state: tuple) -> None:
        self.dtype, self.layout, self.requires_grad, encoding, self.pin_memory = state[:5]
        self.strides = state[5] if len(state) > 5 else None  # (older torch wrote five fields)
        self.memory_format = _DECODE[_MEM_FORMAT_ENCODING(encoding)]
        self.__class__ = TensorProperties


def _storage_info_state(info) -> dict:
    return {k: v for k, v in vars(info).items() if v is not None}


def install(fmt: dict) -> None:
    """torch's names and encodings into ``fmt`` (the core's ``storage.METADATA_FORMAT``)."""
    for cls in list(fmt["names"]):
        fmt["names"][cls] = (f"{_TORCH}.{'filesystem' if cls is storage._StorageInfo else 'metadata'}",
                             cls.__name__)
    fmt["names"][_MEM_FORMAT_ENCODING] = (f"{_TORCH}.metadata", "_MEM_FORMAT_ENCODING")
    fmt["states"].update({TensorProperties: _properties_state, storage._StorageInfo: _storage_info_state})
    fmt["classes"][(f"{_TORCH}.metadata", "TensorProperties")] = _TorchTensorProperties


install(storage.METADATA_FORMAT)
