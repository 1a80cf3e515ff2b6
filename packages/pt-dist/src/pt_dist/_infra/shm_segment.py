"""One shared-memory segment mapped by every rank of a group (a file in ``/dev/shm``, unlinked once all attached).

Rank 0 creates the file (``O_EXCL``, mode 0600, a random name) and publishes its path in the group's store;
the others open it; once every rank has it mapped, rank 0 unlinks it, so nothing is left behind even if a
rank is killed later. A rank 0 killed before that (torchrun and ``mp.spawn`` SIGTERM every rank when one
fails) leaves the name behind; the next group made on the host removes the names of dead creators. The
file is sized with ``ftruncate``: pages appear only when first touched, and touching one the filesystem has
no room for kills the process (SIGBUS), so ``PageReservation`` reserves them with ``fallocate`` before first
use, where running out is an error every rank can raise.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import mmap
import os
import re
import secrets
import tempfile
import time

from pt_dist._infra.errors import DistError

logger = logging.getLogger(__name__)
MIN_SLOT_BYTES = 64 << 10


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def free_bytes() -> int:
    """Room left in the shared-memory filesystem (docker's default ``/dev/shm`` is only 64 MB)."""
    st = os.statvfs(shm_dir())
    return st.f_bavail * st.f_frsize


def fit_slots(store, rank: int, size: int, want: int, fixed: int, group_name: str) -> int:
    """Collective: rank 0 shrinks ``size + 2`` staging slots of ``want`` bytes (plus ``fixed``) to half the room the
    filesystem has, and every rank uses its answer. Groups made together each see the same room, so they can
    still overrun it; ``PageReservation`` turns that into an error."""
    if rank == 0:
        fit = (free_bytes() // 2 - fixed) // (size + 2)
        if fit < want:
            if fit < MIN_SLOT_BYTES:
                raise DistError(f"shm group {group_name!r}: {shm_dir()} has {free_bytes()} bytes free, too little "
                                f"for {size} ranks; enlarge it (docker run --shm-size)")
            logger.warning("shm group %r: %s has %d bytes free, so staging slots shrink from %d to %d bytes "
                           "(docker run --shm-size raises the limit)", group_name, shm_dir(), free_bytes(), want, fit)
            want = fit
        store.set("shm/slot_bytes", str(want))
        return want
    return int(store.get("shm/slot_bytes"))


def _pid_namespace() -> str:
    """Which pid namespace this process sees (containers sharing one /dev/shm each have their own)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "unknown"


def sweep_stale_segments() -> list[str]:
    """Remove segment names whose creator (the pid in the name, in this pid namespace) is gone: what a rank killed
    mid-setup left. Names made in other pid namespaces (another container on a shared /dev/shm) are not ours to
    judge: their pids mean nothing here."""
    removed, me, ns = [], os.getuid(), _pid_namespace()
    if ns == "unknown":
        return removed
    for name in os.listdir(shm_dir()):
        m = re.fullmatch(rf"pt_dist_(\d+)_[0-9a-f]{{16}}_ns{ns}", name)
        path = os.path.join(shm_dir(), name)
        try:
            if m and os.stat(path).st_uid == me:
                os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):  # another group's sweep may take it first
                os.unlink(path)
                removed.append(path)
        except OSError:  # gone already, or a pid of another user's
            pass
    return removed


def map_shared_segment(store, rank: int, size: int, nbytes: int, key: str, timeout: float,
                       group_name: str, keep_fd: bool = False):
    """Collective: every rank of the group calls it with the same ``key`` and ``nbytes``.

    Returns the mapping, or ``(mapping, fd)`` with ``keep_fd`` (to reserve pages later with fallocate)."""
    if rank == 0:
        sweep_stale_segments()
        path = os.path.join(shm_dir(), f"pt_dist_{os.getpid()}_{secrets.token_hex(8)}_ns{_pid_namespace()}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    else:
        made, path = store.get(f"{key}/path").decode().split(" ", 1)
        if int(made) != nbytes:
            _refuse(store, key, group_name, f"rank {rank} expects a segment of {nbytes} bytes, rank 0 made {made}: "
                                            f"the ranks disagree on the group (different world sizes?)")
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            _refuse(store, key, group_name, f"rank {rank} cannot see rank 0's segment {path}; the 'shm' backend "
                                            f"needs every rank on one host (and one /dev/shm): use 'tcp', 'gloo' or "
                                            f"'nccl' across hosts")
    mm = None
    try:
        if rank == 0:
            os.ftruncate(fd, nbytes)
            store.set(f"{key}/path", f"{nbytes} {path}")
        mm = mmap.mmap(fd, nbytes)
        store.add(f"{key}/attached", 1)
        if rank == 0:
            _wait_attached(store, size, key, path, timeout, group_name)
    except BaseException:  # a peer missing, or Ctrl-C: the memory goes with the last descriptor and mapping
        if mm is not None:
            mm.close()
        if keep_fd:
            os.close(fd)
        raise
    finally:
        if not keep_fd:
            os.close(fd)
        if rank == 0:
            os.unlink(path)  # attached or given up on: the name is not needed any more either way
    return (mm, fd) if keep_fd else mm


def _refuse(store, key: str, group_name: str, why: str) -> None:
    store.set(f"{key}/missing", why)  # rank 0 stops waiting for us at once
    raise DistError(f"shm group {group_name!r}: {why}")


def _wait_attached(store, size: int, key: str, path: str, timeout: float, group_name: str) -> None:
    deadline = time.monotonic() + timeout
    while int(store.get(f"{key}/attached")) < size:
        if store.check([f"{key}/missing"]):
            raise DistError(f"shm group {group_name!r}: a peer refused this host's {path}: "
                            f"{store.get(f'{key}/missing').decode()}")
        if time.monotonic() > deadline:
            raise DistError(f"shm group {group_name!r}: peers did not attach {path} within {timeout:.1f}s")
        time.sleep(0.001)


class PageReservation:
    """Reserves a segment's pages region by region as collectives first reach them (``fallocate`` on the fd).

    ``starts`` are the regions' first bytes; each region is filled from its start, so one high-water mark per
    region is enough and the steady state costs a comparison."""

    def __init__(self, fd: int, starts: list[int], group_name: str):
        self._fd, self._starts, self._upto, self.group_name = fd, starts, list(starts), group_name

    def cover(self, offset: int, nbytes: int) -> None:
        k, end = bisect.bisect_right(self._starts, offset) - 1, offset + nbytes
        if end <= self._upto[k]:
            return
        try:
            os.posix_fallocate(self._fd, self._upto[k], end - self._upto[k])
        except OSError as e:
            raise DistError(f"shm group {self.group_name!r}: no room in {shm_dir()} for {end - self._upto[k]} more "
                            f"bytes of staging ({e.strerror}); enlarge it (docker run --shm-size) or create fewer "
                            f"shm groups") from e
        self._upto[k] = end

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
