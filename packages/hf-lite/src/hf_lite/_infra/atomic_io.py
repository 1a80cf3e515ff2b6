"""Atomic writes: one file (temporary name, fsync, rename) or a whole checkpoint directory (staged beside it, fsync,
swapped in), so a crash mid-save leaves the old checkpoint or the new one, never new shards under an old index.

``save_pretrained`` stages its directory through ``atomic_save_directory``; the Trainer, whose ranks all write into
one checkpoint, stages it under a name every rank knows and puts it in place with ``replace_directory``."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator

import torch

logger = logging.getLogger(__name__)


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
    # os.open with 0o666 lets the umask decide the mode, as open() does (mkstemp would leave 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_directory(directory)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def torch_save_synced(obj, path: str) -> None:
    """``torch.save`` into ``path`` and fsync it (a file inside a staged directory: the directory is renamed later)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


@contextlib.contextmanager
def atomic_save_directory(save_directory: str | os.PathLike, owned: Callable[[str], bool]) -> Iterator[str]:
    """Yield a staging directory to write a checkpoint into; on success it replaces ``save_directory`` at once.

    Entries of an existing ``save_directory`` that ``owned`` does not claim (a tokenizer saved beside the model,
    other variants, sub-directories) are moved into the new directory, so only the owned files change. On failure
    the staging directory is removed and ``save_directory`` is untouched.
    """
    # Through a symlink to the directory it points at, so the link keeps pointing at the checkpoint.
    target = os.path.realpath(os.fspath(save_directory))
    if os.path.isfile(target):
        raise ValueError(f"Provided path ({save_directory}) should be a directory, not a file")
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    stage = os.path.join(parent, f".{name}.saving-{uuid.uuid4().hex[:12]}")
    in_target = os.path.isdir(target) and os.path.samefile(os.getcwd(), target)
    os.mkdir(stage, 0o777)  # the umask decides the mode, as for os.makedirs
    try:
        yield stage
        fsync_directory(stage)
        old = _swap_in(stage, target, owned)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if old is not None:
        _drop_old(old, target, owned)
        if in_target:  # saved into ".": the process sat in the directory just removed; follow the new one
            os.chdir(target)


def _swap_in(stage: str, target: str, owned: Callable[[str], bool]) -> str | None:
    """Put ``stage`` at ``target``; return where the previous directory went (None if there was none)."""
    if not os.path.isdir(target):
        os.rename(stage, target)
        fsync_directory(os.path.dirname(target))
        return None
    written = set(os.listdir(stage))
    moved = []
    try:
        for entry in os.listdir(target):
            if not owned(entry) and entry not in written:
                os.rename(os.path.join(target, entry), os.path.join(stage, entry))
                moved.append(entry)
        if _exchange(stage, target):
            old = stage
        else:
            # No atomic swap on this system: `target` is missing for a moment, the old checkpoint whole in `old`.
            old = f"{stage}.old"
            os.rename(target, old)
            try:
                os.rename(stage, target)
            except BaseException:
                os.rename(old, target)
                raise
    except BaseException:
        for entry in moved:
            os.rename(os.path.join(stage, entry), os.path.join(target, entry))
        raise
    fsync_directory(os.path.dirname(target))
    return old


def _drop_old(old: str, target: str, owned: Callable[[str], bool]) -> None:
    """Remove the previous checkpoint; entries others wrote into it during the swap move to ``target`` first."""
    try:
        for entry in os.listdir(old):
            if not owned(entry) and not os.path.exists(os.path.join(target, entry)):
                os.rename(os.path.join(old, entry), os.path.join(target, entry))
    except OSError as err:
        logger.warning("Could not move %s into %s after saving: %s; left in place", old, target, err)
        return
    shutil.rmtree(old, ignore_errors=True)


def replace_directory(stage: str, final: str) -> None:
    """Put the finished ``stage`` at ``final``; an older ``final`` (a re-save of the same step) is swapped out in one
    step where the system can, else moved aside first (``final`` then briefly absent, never half-written)."""
    fsync_directory(stage)
    if not os.path.exists(final):
        os.rename(stage, final)
    elif _exchange(stage, final):
        shutil.rmtree(stage, ignore_errors=True)
    else:
        old = f"{stage}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    fsync_directory(os.path.dirname(final))
