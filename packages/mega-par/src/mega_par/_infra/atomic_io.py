"""Atomic file writes: a checkpoint file is either the old one, absent, or complete, never half written.

``atomic_write`` writes to a temporary name beside the target, fsyncs, then renames over it (``os.replace`` is
atomic on POSIX), and returns the file's sha256 so a reader can later tell a truncated or altered file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable


def atomic_write(path: str, write: Callable[[str], object]) -> str:
    """``write(tmp_path)`` fills a temporary file; it is fsynced and renamed to ``path``. Returns its sha256."""
    tmp = f"{path}.tmp.{os.getpid()}"
    write(tmp)
    with open(tmp, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return digest


def atomic_write_text(path: str, text: str) -> str:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    return atomic_write(path, write)
