"""Crash-safe writes: a file is written under a temporary name, flushed to disk and renamed over the old one, and
a directory is assembled aside and renamed into place, so a crash mid-write leaves the previous version whole."""

from __future__ import annotations

import os
import shutil

import torch


def atomic_torch_save(obj, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(text: str, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def staging_dir(parent: str, name: str) -> str:
    """Where ``parent/NAME`` is assembled before :func:`replace_dir` renames it into place."""
    return os.path.join(parent, f".{name}.partial")


def fresh_staging_dir(parent: str, name: str) -> str:
    """An empty :func:`staging_dir`."""
    staging = staging_dir(parent, name)
    os.makedirs(parent, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    return staging


def replace_dir(staging: str, parent: str, name: str) -> None:
    """Rename ``staging`` to ``parent/NAME``; an existing ``NAME`` is moved to ``.NAME.old`` first and removed last,
    so some complete version exists at every instant (:func:`existing_dir` finds it)."""
    final, old = os.path.join(parent, name), os.path.join(parent, f".{name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def existing_dir(parent: str, name: str) -> str | None:
    """``parent/NAME``, or the ``.NAME.old`` a crash inside :func:`replace_dir` left; None if neither exists."""
    for path in (os.path.join(parent, name), os.path.join(parent, f".{name}.old")):
        if os.path.isdir(path):
            return path
    return None
