"""Cross-memory attach: one copy straight between two processes' memories (Linux ``process_vm_readv/writev``).

Staging through a shared segment costs two copies per byte (into the segment, out of it). With CMA the
kernel copies from one process's pages to another's directly, the single-copy path that MPI libraries
take for large messages between ranks on one host (Open MPI's ``smsc/cma``, MPICH's ``--with-cma``).
It needs the right to ptrace the peer (same user; with Yama ``ptrace_scope=1`` only an ancestor may), so
a group probes it once at setup and every rank agrees to use it only if it worked everywhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import torch


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class CrossMemory:
    """``read(pid, addr, local)`` fills ``local`` from ``pid``'s memory at ``addr``; ``write`` is the reverse."""

    def __init__(self):
        self._readv = self._writev = None
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

    def read(self, pid: int, addr: int, local: torch.Tensor) -> None:
        self._move(self._readv, pid, local, addr)

    def write(self, pid: int, local: torch.Tensor, addr: int) -> None:
        self._move(self._writev, pid, local, addr)

    def _move(self, fn, pid: int, local: torch.Tensor, addr: int) -> None:
        """One contiguous range; the kernel may move less than asked (page by page), so loop on the rest."""
        nbytes, done = local.numel() * local.element_size(), 0
        base = local.data_ptr()
        while done < nbytes:
            here = _IOVec(base + done, nbytes - done)
            there = _IOVec(addr + done, nbytes - done)
            got = fn(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
            if got <= 0:
                err = ctypes.get_errno() if got < 0 else errno.EIO
                raise OSError(err, f"{'process_vm_readv' if fn is self._readv else 'process_vm_writev'} "
                                   f"pid {pid} at {addr + done:#x}: {os.strerror(err)}")
            done += got


def probe(cma: CrossMemory, store, rank: int, size: int, prefix: str) -> bool:
    """True on every rank iff every rank could read every peer's memory (an 8-byte token per rank)."""
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
                cma.read(pid, addr, got)
                ok = int(got) == pid * 7919 + j
            except OSError:
                ok = False
    store.set(f"{prefix}/ok/{rank}", b"1" if ok else b"0")
    # every rank reads every verdict (and keeps its token alive until all peers have finished reading it)
    return all(store.get(f"{prefix}/ok/{j}") == b"1" for j in range(size))
