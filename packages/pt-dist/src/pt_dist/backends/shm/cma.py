"""Cross-memory attach: one copy straight between two processes' memories (Linux ``process_vm_readv/writev``).

Staging through a shared segment costs two copies per byte (into the segment, out of it). With CMA the
kernel copies from one process's pages to another's directly, the single-copy path that MPI libraries
take for large messages between ranks on one host (Open MPI's ``smsc/cma``, MPICH's ch4 IPC, UCX's ``scopy/cma``).
It needs the right to ptrace the peer (same user; with Yama ``ptrace_scope=1`` only an ancestor may), so
a group probes it once at setup and every rank agrees to use it only if it worked everywhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import torch

from pt_dist._infra.errors import DistBackendError, missing_text
from pt_dist._infra.huge_pages import HugePageAdvisor
from pt_dist.backends.shm.counters import ABORT
from pt_dist.process_group import combiner, finish_avg_

# Collectives from this many bytes take the single-copy path where the group agreed it works; below it,
# staging through the segment is cheaper than the extra barrier and the system calls.
MIN_BYTES = int(os.environ.get("PT_DIST_SHM_CMA_BYTES", 256 << 10))
# Reductions go chunk by chunk, small enough that a chunk read from a peer is still in L2 when it is
# folded in and pushed back out.
CHUNK_BYTES = 256 << 10


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


class SingleCopyCollectives:
    """The single-copy algorithms of ``ProcessGroupSHM`` (which supplies the control words, barriers and peer checks).

    Each starts by publishing its tensor's address next to its barrier counter; after that barrier every
    rank knows where its peers' tensors live (and that they are not being modified), copies with
    ``process_vm_readv/writev``, and a closing barrier says no one touches a peer's tensor any more.
    """

    _huge: HugePageAdvisor | None = None

    def _meet(self, op: str, t: torch.Tensor, mine: str | None = None) -> list[tuple[int, int, int]]:
        """Publish ``t``'s address, barrier (doubling as the header check with ``mine``); peers' (rank, pid, addr)."""
        if self._huge is None:
            self._huge = HugePageAdvisor()
        self._huge.note(*_addr(t))  # peers are about to pin its pages: on its second use, make them huge
        ctl, size = self._ctl, self._size
        ctl[(1 + self._rank) * 8 + 1] = t.data_ptr()
        self._arrive_and_wait(op)
        if mine is not None:
            self._check_headers(op, mine, self._read_headers())
        return [(j, ctl[(1 + size + j) * 8], ctl[(1 + j) * 8 + 1]) for j in range(size) if j != self._rank]

    def _pull(self, op: str, peer, offset: int, local_addr: int, nbytes: int) -> None:
        """Fill ``nbytes`` at ``local_addr`` from the peer's tensor at ``offset``."""
        try:
            self._cma.read(peer[1], peer[2] + offset, local_addr, nbytes)
        except OSError as e:
            raise self._copy_failed(op, peer[0], e) from e

    def _push(self, op: str, local_addr: int, nbytes: int, peer, offset: int) -> None:
        if self._ctl[ABORT]:  # a peer gave up: its tensor may be gone, so write nothing more into it
            self._check_peers(op, self._epoch + 1, False)
        try:
            self._cma.write(peer[1], local_addr, nbytes, peer[2] + offset)
        except OSError as e:
            raise self._copy_failed(op, peer[0], e) from e

    def _copy_failed(self, op: str, j: int, e: OSError) -> DistBackendError:
        if e.errno == errno.ESRCH:  # its memory is torn down already, though /proc may not show it dead yet
            return DistBackendError(f"{op} on shm group {self.group_name!r}: rank {j} exited during a cross-memory "
                                    f"copy; {missing_text([j])}")
        self._check_peers(op, self._epoch + 1, False)
        return DistBackendError(f"{op} on shm group {self.group_name!r}: cross-memory copy with rank {j} failed: {e}; "
                                f"{missing_text([j])}")

    def _chunk_scratch(self, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """(elements per chunk, a chunk of scratch of ``dtype``)."""
        step = max(1, CHUNK_BYTES // dtype.itemsize)
        if self._scratch.numel() < step * dtype.itemsize:
            self._scratch = torch.empty(step * dtype.itemsize, dtype=torch.uint8)
        return step, self._scratch[:step * dtype.itemsize].view(dtype)

    def _cma_all_reduce(self, flat: torch.Tensor, op, mine: str | None) -> None:
        """For my 1/N slice, chunk by chunk: read each peer's part into L2-sized scratch and fold it into
        mine, then write the result straight into every peer's tensor. Rank r only reads and writes slice r
        of a peer's tensor, which the peer itself never touches, so nothing races; every slice is reduced
        once, so all ranks get bitwise the same result. The loop is the hot path of large all-reduces with
        more ranks than cores (CPU-bound), so it keeps Python per chunk to the copies and the folds."""
        n, r, size, item = flat.numel(), self._rank, self._size, flat.element_size()
        peers = self._meet("all_reduce", flat, mine)
        step, tmp = self._chunk_scratch(flat.dtype)
        fold, base, sbase, ctl = combiner(op, flat.dtype), flat.data_ptr(), tmp.data_ptr(), self._ctl
        read, write, peer = self._cma.read, self._cma.write, peers[0]
        try:
            for part in flat[(n * r) // size:(n * (r + 1)) // size].split(step):
                nbytes, off = part.numel() * item, part.data_ptr() - base
                got = tmp if part.numel() == step else tmp[:part.numel()]
                for peer in peers:
                    read(peer[1], peer[2] + off, sbase, nbytes)
                    fold(part, got, out=part)
                finish_avg_(part, op, size)
                if ctl[ABORT]:  # a peer gave up: its tensor may be gone, so write nothing more into it
                    self._check_peers("all_reduce", self._epoch + 1, False)
                for peer in peers:
                    write(peer[1], base + off, nbytes, peer[2] + off)
        except OSError as e:
            raise self._copy_failed("all_reduce", peer[0], e) from e
        self._arrive_and_wait("all_reduce")

    def _cma_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op) -> None:
        """Fold block r of every peer's input into my output, chunk by chunk, reading it where it lies."""
        m, r, item = out.numel(), self._rank, out.element_size()
        peers = self._meet("reduce_scatter_tensor", inp)
        step, tmp = self._chunk_scratch(out.dtype)
        fold, sbase, read, peer = combiner(op, out.dtype), tmp.data_ptr(), self._cma.read, peers[0]
        mine = inp[r * m:(r + 1) * m]
        try:
            for part, own in zip(out.split(step), mine.split(step)):
                nbytes, off = part.numel() * item, own.data_ptr() - inp.data_ptr()
                got = tmp if part.numel() == step else tmp[:part.numel()]
                for k, peer in enumerate(peers):  # the first fold reads my own block and writes the output
                    read(peer[1], peer[2] + off, sbase, nbytes)
                    fold(own if k == 0 else part, got, out=part)
                finish_avg_(part, op, self._size)
        except OSError as e:
            raise self._copy_failed("reduce_scatter_tensor", peer[0], e) from e
        self._arrive_and_wait("reduce_scatter_tensor")

    def _cma_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Read every peer's input straight into its block of my output: one copy per byte."""
        m = inp.numel()
        peers = self._meet("all_gather", inp)
        out[self._rank * m:(self._rank + 1) * m].copy_(inp)
        for peer in peers:
            self._pull("all_gather", peer, 0, *_addr(out[peer[0] * m:(peer[0] + 1) * m]))
        self._arrive_and_wait("all_gather")

    def _cma_gather(self, outs: list[torch.Tensor], inp: torch.Tensor, dst: int) -> None:
        """The root reads every peer's input straight into that peer's output tensor; the others only wait."""
        peers = self._meet("gather", inp)
        if self._rank == dst:
            outs[dst].copy_(inp)
            for peer in peers:
                self._pull("gather", peer, 0, *_addr(outs[peer[0]]))
        self._arrive_and_wait("gather")

    def _cma_scatter(self, out: torch.Tensor, ins: list[torch.Tensor], src: int) -> None:
        """The root writes each piece straight into its rank's output tensor."""
        peers = self._meet("scatter", out)
        if self._rank == src:
            out.copy_(ins[src])
            for peer in peers:
                self._push("scatter", *_addr(ins[peer[0]]), peer, 0)
        self._arrive_and_wait("scatter")

    def _cma_broadcast(self, t: torch.Tensor, src: int) -> None:
        peers = self._meet("broadcast", t)
        if self._rank != src:
            self._pull("broadcast", next(p for p in peers if p[0] == src), 0, *_addr(t))
        self._arrive_and_wait("broadcast")


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
