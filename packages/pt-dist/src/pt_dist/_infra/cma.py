"""Cross-memory attach: one copy straight between two processes' memories (Linux ``process_vm_readv/writev``).

Staging through a shared segment costs two copies per byte (into the segment, out of it). With CMA the
kernel copies from one process's pages to another's directly, the single-copy path that MPI libraries
take for large messages between ranks on one host (Open MPI's ``smsc/cma``, MPICH's ch4 IPC, UCX's ``scopy/cma``).
It needs the right to ptrace the peer (same user; with Yama ``ptrace_scope=1`` only an ancestor may), so
a group probes it once at setup (``probe``) and every rank agrees to use it only if it worked everywhere. The
collectives built on it are ``single_copy.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import torch

# Collectives from this many bytes take the single-copy path where the group agreed it works; below it,
# staging through the segment is cheaper than the extra barrier and the system calls.
MIN_BYTES = int(os.environ.get("PT_DIST_SHM_CMA_BYTES", 256 << 10))


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class CrossMemory:
    """``read(pid, addr, local_addr, nbytes)`` copies from ``pid``'s memory at ``addr``; ``write`` the reverse.

    Addresses are raw (``tensor.data_ptr()``); the two one-entry iovecs are reused from call to call, since a
    256 KiB chunk costs only tens of microseconds to copy and Python-side setup would otherwise show.
    One instance per group: its OpQueue runs the collectives one at a time, so the iovecs are never shared.
    """

    def __init__(self):
        self._readv = self._writev = None
        self._here, self._there = _IOVec(), _IOVec()
        self._here_ref, self._there_ref = ctypes.byref(self._here), ctypes.byref(self._there)
        if sys.platform.startswith("linux") and not os.environ.get("PT_DIST_NO_CMA"):
            libc = ctypes.CDLL(None, use_errno=True)
            if hasattr(libc, "process_vm_readv"):
                self._readv, self._writev = libc.process_vm_readv, libc.process_vm_writev
                for fn in (self._readv, self._writev):
                    fn.restype = ctypes.c_ssize_t
                    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                   ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]

    @property
    def available(self) -> bool:
        return self._readv is not None

    def read(self, pid: int, addr: int, local_addr: int, nbytes: int) -> None:
        self._move(self._readv, pid, local_addr, nbytes, addr)

    def write(self, pid: int, local_addr: int, nbytes: int, addr: int) -> None:
        self._move(self._writev, pid, local_addr, nbytes, addr)

    def _move(self, fn, pid: int, base: int, nbytes: int, addr: int) -> None:
        """One contiguous range, nearly always in one call; the kernel may move less than asked (page by page),
        so loop on the rest."""
        here, there, done = self._here, self._there, 0
        while done < nbytes:
            here.iov_base, there.iov_base = base + done, addr + done
            here.iov_len = there.iov_len = nbytes - done
            got = fn(pid, self._here_ref, 1, self._there_ref, 1, 0)
            if got <= 0:
                err = ctypes.get_errno() if got < 0 else errno.EIO
                raise OSError(err, f"{'process_vm_readv' if fn is self._readv else 'process_vm_writev'} "
                                   f"pid {pid} at {addr + done:#x}: {os.strerror(err)}")
            done += got


def _addr(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.numel() * t.element_size()


def probe(cma: CrossMemory, store, rank: int, size: int, prefix: str) -> int | None:
    """The group's single-copy threshold in bytes, the same on every rank; None where some rank could not read
    every peer's memory (an 8-byte token per rank).

    Each rank's ``MIN_BYTES`` comes from its own environment, so the ranks agree on the largest: ranks that
    took different paths for one collective would each wait for copies the other never makes.
    """
    ok = cma.available
    if size > 1:
        token = torch.tensor([os.getpid() * 7919 + rank], dtype=torch.int64)
        store.set(f"{prefix}/addr/{rank}", f"{os.getpid()} {token.data_ptr()}" if ok else "-")
        got = torch.zeros(1, dtype=torch.int64)
        for j in range(size):
            where = store.get(f"{prefix}/addr/{j}").decode()
            if j == rank or not ok:
                continue
            if where == "-":
                ok = False
                continue
            pid, addr = map(int, where.split())
            try:
                cma.read(pid, addr, *_addr(got))
                ok = int(got) == pid * 7919 + j
            except OSError:
                ok = False
    store.set(f"{prefix}/ok/{rank}", f"{int(ok)} {MIN_BYTES}")
    # every rank reads every verdict (and keeps its token alive until all peers have finished reading it)
    verdicts = [store.get(f"{prefix}/ok/{j}").decode().split() for j in range(size)]
    if not all(v[0] == "1" for v in verdicts):
        return None
    return max(int(v[1]) for v in verdicts)
