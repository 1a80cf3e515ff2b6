"""Pickles under other names and encodings (how DCP's ``.metadata`` becomes torch's format; no pt_dist imports).

``dumps`` writes each class of ``names`` as the (module, name) given, and an instance of a class in ``states``
as ``states[cls](obj)`` (what the other program's ``__setstate__`` reads), so another program whose classes have
those names (torch's ``torch.distributed.checkpoint.metadata``) loads the file as its own. ``loads`` maps those
names, and the classes' own, back to the classes (``classes`` maps further names: a class reading another
program's state encoding), and admits nothing else but the few plain values such a file holds (``torch.Size``,
dtypes, layouts, memory formats, paths): a file naming anything else is refused before it can run.
"""

from __future__ import annotations

import copyreg
import io
import pickle

import torch

__all__ = ["dumps", "loads"]

_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                 ("pathlib", "PureWindowsPath")}


class _RenamingPickler(pickle._Pickler):
    """The pure-Python pickler (the C one insists a class's name import to that very class)."""

    def __init__(self, file, names: dict, states: dict) -> None:
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self._names, self._states = names, states

    def reducer_override(self, obj):
        to_state = self._states.get(type(obj))
        return NotImplemented if to_state is None else (copyreg.__newobj__, (type(obj),), to_state(obj))

    def save_global(self, obj, name=None):
        target = self._names.get(obj) if isinstance(obj, type) else None
        if target is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{target[0]}\n{target[1]}\n".encode())
        self.memoize(obj)


class _AdmittingUnpickler(pickle.Unpickler):
    def __init__(self, file, names: dict, classes: dict) -> None:
        super().__init__(file)
        self._classes = {(cls.__module__, cls.__qualname__): cls for cls in names}
        self._classes.update({written: cls for cls, written in names.items()})
        self._classes.update(classes)

    def find_class(self, module, name):
        if (module, name) in self._classes:
            return self._classes[module, name]
        if (module, name) in _SAFE_GLOBALS or (module == "torch" and isinstance(
                getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"this file holds only the classes it was written with, not {module}.{name}")


def dumps(obj, names: dict[type, tuple[str, str]], states: dict | None = None) -> bytes:
    buf = io.BytesIO()
    _RenamingPickler(buf, names, states or {}).dump(obj)
    return buf.getvalue()


def loads(data: bytes, names: dict[type, tuple[str, str]], classes: dict | None = None):
    return _AdmittingUnpickler(io.BytesIO(data), names, classes or {}).load()
