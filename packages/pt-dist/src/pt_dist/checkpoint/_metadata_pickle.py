"""The ``.metadata`` file: torch's own format, a pickled ``Metadata`` whose classes are named by torch's module
paths (``torch.distributed.checkpoint.metadata.Metadata``, ``...filesystem._StorageInfo``).

pt_dist's classes have torch's fields, so writing renames each of ours to torch's name (torch's ``dcp.load``
then reads a pt_dist checkpoint as its own) and reading renames torch's names back to ours (pt_dist reads a
checkpoint torch wrote) -- without importing torch.distributed.checkpoint on either side. Reading also admits
only those classes and the few torch globals they hold (``torch.Size``, dtypes, layouts, paths): a ``.metadata``
naming anything else is refused before it can run.
"""

from __future__ import annotations

import io
import pickle

import torch

from . import metadata as _md

_TORCH_METADATA = "torch.distributed.checkpoint.metadata"
_TORCH_FILESYSTEM = "torch.distributed.checkpoint.filesystem"
_METADATA_CLASSES = ("BytesStorageMetadata", "ChunkStorageMetadata", "Metadata", "MetadataIndex", "StorageMeta",
                     "TensorProperties", "TensorStorageMetadata", "_MEM_FORMAT_ENCODING")
_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                 ("pathlib", "PureWindowsPath")}


def _ours():
    """{our class: torch's (module, name)}; the reverse is what reading uses."""
    from .filesystem import _StorageInfo

    names = {getattr(_md, n): (_TORCH_METADATA, n) for n in _METADATA_CLASSES}
    names[_StorageInfo] = (_TORCH_FILESYSTEM, "_StorageInfo")
    return names


class _TorchNamesPickler(pickle._Pickler):
    """The pure-Python pickler (the C one insists a class's name import to that very class)."""

    def __init__(self, file, names):
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self._names = names

    def save_global(self, obj, name=None):
        target = self._names.get(obj) if isinstance(obj, type) else None
        if target is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{target[0]}\n{target[1]}\n".encode())
        self.memoize(obj)


class _TorchNamesUnpickler(pickle.Unpickler):
    def __init__(self, file, names):
        super().__init__(file)
        self._classes = {torch_name: cls for cls, torch_name in names.items()}
        self._classes.update({(cls.__module__, cls.__qualname__): cls for cls in names})

    def find_class(self, module, name):
        if (module, name) in self._classes:
            return self._classes[module, name]
        if (module, name) in _SAFE_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                 (torch.dtype, torch.layout))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a checkpoint's .metadata holds only checkpoint metadata, not {module}.{name}")


def dumps(metadata: _md.Metadata) -> bytes:
    buf = io.BytesIO()
    _TorchNamesPickler(buf, _ours()).dump(metadata)
    return buf.getvalue()


def loads(data: bytes) -> _md.Metadata:
    return _TorchNamesUnpickler(io.BytesIO(data), _ours()).load()
