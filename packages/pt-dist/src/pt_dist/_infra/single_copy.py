"""The shm group's single-copy collectives, a shared-memory trick the group calls at one point each: ranks copy
straight between each other's tensors over cross-memory attach (``cma.py``), one copy per byte instead of two
through the segment.

Each collective starts by publishing its tensor's address next to its barrier counter; after that barrier every
rank knows where its peers' tensors live (and that they are not being modified), copies with
``process_vm_readv/writev``, and a closing barrier says no one touches a peer's tensor any more.
"""

from __future__ import annotations

import errno

import torch

from pt_dist._infra.cma import CrossMemory, _addr
from pt_dist._infra.errors import DistBackendError, missing_text
from pt_dist._infra.huge_pages import HugePageAdvisor

# Reductions go chunk by chunk, small enough that a chunk read from a peer is still in L2 when it is
# folded in and pushed back out.
CHUNK_BYTES = 256 << 10


class SingleCopy:
    """``pg`` is the ``ProcessGroupSHM``: its control words (``pg._ctl``), counters (``pg.counters``) and headers;
    ``combiner(op, dtype)`` and ``finish_avg_(t, op, world)`` are its reduction arithmetic (``process_group.py``)."""

    def __init__(self, pg, cma: CrossMemory, combiner, finish_avg_):
        self.pg, self.cma, self.combiner, self.finish_avg_ = pg, cma, combiner, finish_avg_
        self._huge = HugePageAdvisor()
        self._scratch = torch.empty(0, dtype=torch.uint8)

    def _meet(self, op: str, t: torch.Tensor, mine: str | None = None) -> list[tuple[int, int, int]]:
        """Publish ``t``'s address, barrier (doubling as the header check with ``mine``); peers' (rank, pid, addr)."""
        pg = self.pg
        self._huge.note(*_addr(t))  # peers are about to pin its pages: on its second use, make them huge
        ctl, size = pg._ctl, pg._size
        ctl[(1 + pg._rank) * 8 + 1] = t.data_ptr()
        pg.counters.arrive_and_wait(op)
        if mine is not None:
            pg._check_headers(op, mine, pg._read_headers())
        return [(j, ctl[(1 + size + j) * 8], ctl[(1 + j) * 8 + 1]) for j in range(size) if j != pg._rank]

    def _pull(self, op: str, peer, offset: int, local_addr: int, nbytes: int) -> None:
        """Fill ``nbytes`` at ``local_addr`` from the peer's tensor at ``offset``."""
        try:
            self.cma.read(peer[1], peer[2] + offset, local_addr, nbytes)
        except OSError as e:
            raise self._copy_failed(op, peer[0], e) from e

    def _push(self, op: str, local_addr: int, nbytes: int, peer, offset: int) -> None:
        if self.pg.counters.aborted():  # a peer gave up: its tensor may be gone, so write nothing more into it
            self.pg.counters.check_peers(op)
        try:
            self.cma.write(peer[1], local_addr, nbytes, peer[2] + offset)
        except OSError as e:
            raise self._copy_failed(op, peer[0], e) from e

    def _copy_failed(self, op: str, j: int, e: OSError) -> DistBackendError:
        name = self.pg.group_name
        if e.errno == errno.ESRCH:  # its memory is torn down already, though /proc may not show it dead yet
            return DistBackendError(f"{op} on shm group {name!r}: rank {j} exited during a cross-memory copy; "
                                    f"{missing_text([j])}")
        self.pg.counters.check_peers(op)
        return DistBackendError(f"{op} on shm group {name!r}: cross-memory copy with rank {j} failed: {e}; "
                                f"{missing_text([j])}")

    def _chunk_scratch(self, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """(elements per chunk, a chunk of scratch of ``dtype``)."""
        step = max(1, CHUNK_BYTES // dtype.itemsize)
        if self._scratch.numel() < step * dtype.itemsize:
            self._scratch = torch.empty(step * dtype.itemsize, dtype=torch.uint8)
        return step, self._scratch[:step * dtype.itemsize].view(dtype)

    def all_reduce(self, flat: torch.Tensor, op, mine: str | None) -> None:
        """For my 1/N slice, chunk by chunk: read each peer's part into L2-sized scratch and fold it into
        mine, then write the result straight into every peer's tensor. Rank r only reads and writes slice r
        of a peer's tensor, which the peer itself never touches, so nothing races; every slice is reduced
        once, so all ranks get bitwise the same result. The loop is the hot path of large all-reduces with
        more ranks than cores (CPU-bound), so it keeps Python per chunk to the copies and the folds."""
        pg = self.pg
        n, r, size, item = flat.numel(), pg._rank, pg._size, flat.element_size()
        peers = self._meet("all_reduce", flat, mine)
        step, tmp = self._chunk_scratch(flat.dtype)
        fold, base, sbase, counters = self.combiner(op, flat.dtype), flat.data_ptr(), tmp.data_ptr(), pg.counters
        read, write, peer = self.cma.read, self.cma.write, peers[0]
        try:
            for part in flat[(n * r) // size:(n * (r + 1)) // size].split(step):
                nbytes, off = part.numel() * item, part.data_ptr() - base
                got = tmp if part.numel() == step else tmp[:part.numel()]
                for peer in peers:
                    read(peer[1], peer[2] + off, sbase, nbytes)
                    fold(part, got, out=part)
                self.finish_avg_(part, op, size)
                if counters.aborted():  # a peer gave up: its tensor may be gone, so write nothing more into it
                    counters.check_peers("all_reduce")
                for peer in peers:
                    write(peer[1], base + off, nbytes, peer[2] + off)
        except OSError as e:
            raise self._copy_failed("all_reduce", peer[0], e) from e
        counters.arrive_and_wait("all_reduce")

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op) -> None:
        """Fold block r of every peer's input into my output, chunk by chunk, reading it where it lies."""
        m, r, item = out.numel(), self.pg._rank, out.element_size()
        peers = self._meet("reduce_scatter_tensor", inp)
        step, tmp = self._chunk_scratch(out.dtype)
        fold, sbase, read, peer = self.combiner(op, out.dtype), tmp.data_ptr(), self.cma.read, peers[0]
        mine = inp[r * m:(r + 1) * m]
        try:
            for part, own in zip(out.split(step), mine.split(step)):
                nbytes, off = part.numel() * item, own.data_ptr() - inp.data_ptr()
                got = tmp if part.numel() == step else tmp[:part.numel()]
                for k, peer in enumerate(peers):  # the first fold reads my own block and writes the output
                    read(peer[1], peer[2] + off, sbase, nbytes)
                    fold(own if k == 0 else part, got, out=part)
                self.finish_avg_(part, op, self.pg._size)
        except OSError as e:
            raise self._copy_failed("reduce_scatter_tensor", peer[0], e) from e
        self.pg.counters.arrive_and_wait("reduce_scatter_tensor")

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Read every peer's input straight into its block of my output: one copy per byte."""
        m, r = inp.numel(), self.pg._rank
        peers = self._meet("all_gather", inp)
        out[r * m:(r + 1) * m].copy_(inp)
        for peer in peers:
            self._pull("all_gather", peer, 0, *_addr(out[peer[0] * m:(peer[0] + 1) * m]))
        self.pg.counters.arrive_and_wait("all_gather")

    def gather(self, outs: list[torch.Tensor], inp: torch.Tensor, dst: int) -> None:
        """The root reads every peer's input straight into that peer's output tensor; the others only wait."""
        peers = self._meet("gather", inp)
        if self.pg._rank == dst:
            outs[dst].copy_(inp)
            for peer in peers:
                self._pull("gather", peer, 0, *_addr(outs[peer[0]]))
        self.pg.counters.arrive_and_wait("gather")

    def scatter(self, out: torch.Tensor, ins: list[torch.Tensor], src: int) -> None:
        """The root writes each piece straight into its rank's output tensor."""
        peers = self._meet("scatter", out)
        if self.pg._rank == src:
            out.copy_(ins[src])
            for peer in peers:
                self._push("scatter", *_addr(ins[peer[0]]), peer, 0)
        self.pg.counters.arrive_and_wait("scatter")

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        peers = self._meet("broadcast", t)
        if self.pg._rank != src:
            self._pull("broadcast", next(p for p in peers if p[0] == src), 0, *_addr(t))
        self.pg.counters.arrive_and_wait("broadcast")
