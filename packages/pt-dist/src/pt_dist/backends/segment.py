"""One shared-memory segment mapped by every rank of a group (a file in ``/dev/shm``, unlinked once all attached).

Rank 0 creates the file (``O_EXCL``, mode 0600, a random name) and publishes its path in the group's store;
the others open it; once every rank has it mapped, rank 0 unlinks it, so nothing is left behind even if a
rank is killed later. The file is sized with ``ftruncate``: pages appear only when first touched.
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
import time

from pt_dist.errors import DistError


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def free_bytes() -> int:
    """Room left in the shared-memory filesystem (docker's default ``/dev/shm`` is only 64 MB)."""
    st = os.statvfs(shm_dir())
    return st.f_bavail * st.f_frsize


def map_shared_segment(store, rank: int, size: int, nbytes: int, key: str, timeout: float,
                       group_name: str, keep_fd: bool = False):
    """Collective: every rank of the group calls it with the same ``key`` and ``nbytes``.

    Returns the mapping, or ``(mapping, fd)`` with ``keep_fd`` (to reserve pages later with fallocate)."""
    if rank == 0:
        path = os.path.join(shm_dir(), f"pt_dist_{os.getpid()}_{secrets.token_hex(8)}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, nbytes)
        store.set(f"{key}/path", path)
    else:
        path = store.get(f"{key}/path").decode()
        fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
    finally:
        if not keep_fd:
            os.close(fd)
    store.add(f"{key}/attached", 1)
    if rank == 0:
        deadline = time.monotonic() + timeout
        while int(store.get(f"{key}/attached")) < size:
            if time.monotonic() > deadline:
                raise DistError(f"shm group {group_name!r}: peers did not attach {path} within {timeout:.1f}s")
            time.sleep(0.001)
        os.unlink(path)
    return (mm, fd) if keep_fd else mm
