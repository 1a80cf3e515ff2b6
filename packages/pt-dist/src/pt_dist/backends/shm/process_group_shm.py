"""The ``"shm"`` backend: collectives through one shared-memory segment, for ranks on one host.

The shape of a shared-memory all-reduce (as in DeepSpeed's ``shm`` comm backend and oneCCL): every
rank copies its chunk into its own staging slot, raises its flag, and once all flags are up each
rank reduces only its 1/N slice of the chunk, reading the N slots and writing a shared result
buffer; after a second flag round every rank copies the whole result out. Each rank touches
N x 1/N of the data in the reduction, so the work is spread like a ring but with no hops. Small
all-reduces skip the slicing (one barrier, every rank folds all N copies), and from ``cma.MIN_BYTES`` up
(the largest of the ranks' settings) all-reduce, all-gather, reduce-scatter, broadcast, gather and scatter
skip the staging too where the kernel allows cross-memory attach: ranks copy straight between each other's
tensors, one copy per byte (``cma.py``); all-reduces on tensors from the group's symmetric heap load and
store peers' buffers directly (``symmetric_memory.py``).

Synchronisation is by monotonically increasing per-rank counters on separate cache lines: waiting
means spinning on the others' counters, never an OS barrier, which is what makes small messages fast;
a peer that is late is waited for with ``futex`` on its counter's address (``futex.py``), so an
oversubscribed CPU is not burnt by spinning. A waiter also watches an abort word and the peers' pids,
so a dead or failed rank turns into a ``DistError`` in milliseconds, or at worst at the timeout
(``counters.py``).
Point-to-point ``send``/``recv`` go over the authenticated socket mesh.

This file is the idea (the staged segment and its barriers), then ``counters.py`` (the barrier, and how a
waiter notices failures). The shared-memory tricks are objects the group holds and calls at one point each, in
``_infra/``: ``self.single_copy`` (``single_copy.py`` over ``cma.py``, with ``huge_pages.py``), ``self.symmetric``
(``symmetric_memory.py`` over ``symmetric_heap.py``); beneath everything, ``futex.py`` and ``shm_segment.py``
(making, sharing, reserving and sweeping the segment: what keeps a full ``/dev/shm`` or a killed rank from
turning into a SIGBUS or a leak).
"""

from __future__ import annotations

import logging
import os
import struct

import torch

from pt_dist._infra import cma
from pt_dist._infra import shm_segment as segment
from pt_dist._infra.futex import Futex
from pt_dist._infra.shm_segment import map_shared_segment
from pt_dist._infra.single_copy import SingleCopy
from pt_dist._infra.symmetric_memory import SymmetricMemory
from pt_dist.backends.arguments import contig, desc, reduced
from pt_dist.backends.base import NativeProcessGroup
from pt_dist.backends.peer_mesh import PeerMesh
from pt_dist.backends.shm.counters import LINE, CounterBarrier
from pt_dist.process_group import ReduceOp, combine_, combiner, finish_avg_

logger = logging.getLogger(__name__)
HEADER_BYTES = 4096
SLOT_BYTES = int(os.environ.get("PT_DIST_SHM_SLOT_BYTES", 64 << 20))  # sparse: pages appear on first use
# All-reduces with size x world_size up to this take the one-barrier path: every rank then reads all N
# copies, which costs more memory traffic than the sliced path but saves two synchronisations.
SMALL_BYTES = 2 << 20


class ProcessGroupSHM(NativeProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: float, group_name: str = "", secret: bytes = b"",
                 slot_bytes: int | None = None, single_copy: bool = True):
        super().__init__(rank, size, timeout, group_name)
        ctrl = (1 + 2 * size) * LINE
        slot_bytes = segment.fit_slots(store, rank, size, slot_bytes or SLOT_BYTES,
                                       ctrl + 2 * size * HEADER_BYTES + 2 * SMALL_BYTES, group_name)
        self.slot_bytes = max(2 * LINE, slot_bytes - slot_bytes % (2 * LINE))
        self._hdr_off = ctrl
        self._slot_off = ctrl + 2 * size * HEADER_BYTES
        self._res_off = self._slot_off + size * self.slot_bytes
        self._small_off = self._res_off + 2 * self.slot_bytes
        total = self._small_off + 2 * SMALL_BYTES
        self._mm, fd = map_shared_segment(store, rank, size, total, "shm", timeout, group_name, keep_fd=True)
        self._pages = segment.PageReservation(
            fd, [0] + [self._slot_off + j * self.slot_bytes for j in range(size + 2)] + [self._small_off], group_name)
        self._pages.cover(0, self._slot_off)  # control words and headers
        self._ctl = memoryview(self._mm)[:ctrl].cast("q")  # word i*8: counter of rank i-1; word 0: abort
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._ctl[(1 + size + rank) * LINE // 8] = os.getpid()
        self.counters = CounterBarrier(self, self._ctl, self._bytes.data_ptr(), Futex())
        self._store = store  # symmetric_empty maps its heap through it, on first use
        self.symmetric = SymmetricMemory(self, combiner, finish_avg_)
        crossing = cma.CrossMemory()
        try:  # two rendezvous (every rank passes the same single_copy): a peer missing, or Ctrl-C, frees the segment
            # None, or the size from which collectives take the single-copy path (agreed by every rank)
            self._cma_bytes = cma.probe(crossing, store, rank, size, "shm/cma") if single_copy else None
            self._use_cma = self._cma_bytes is not None
            self.single_copy = SingleCopy(self, crossing, combiner, finish_avg_) if self._use_cma else None
            self.mesh = PeerMesh(store, rank, size, secret, timeout, group_name)
        except BaseException:
            self._pages.close()
            raise
        if single_copy and not self._use_cma and size > 1 and rank == 0:
            logger.info("shm group %r: a rank may not read its peers' memory (process_vm_readv); large "
                        "collectives stage through shared memory instead", group_name)
        self._pids = None
        # True after a collective whose ranks read peers' slots after its last barrier: the next one that
        # stages data before its first barrier must wait for them first
        self._slots_read_late = False

    def name(self) -> str:
        return "shm"

    def shutdown(self) -> None:
        self._queue.shutdown()  # async work issued before finishes first (bounded), as on tcp and torch's gloo;
        self.counters.leave()  # a collective still waiting in another thread raises now, not at the timeout, and
        super().shutdown()  # so do peers waiting for this rank
        self.mesh.close()
        self._pages.close()
        self.symmetric.close()

    def _abort(self) -> None:
        self.counters.abort()
        self.mesh.close()

    def symmetric_empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.symmetric.empty(*shape, dtype=dtype)

    def symmetric_free_bytes(self) -> int:
        return self.symmetric.free_bytes()

    def _placement(self, t: torch.Tensor) -> tuple[str, str]:
        return self.symmetric.placement(t)

    # views of the segment ------------------------------------------------------------------------
    def _view(self, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self._pages.cover(offset, numel * dtype.itemsize)
        return self._bytes[offset:offset + numel * dtype.itemsize].view(dtype)

    def _slot(self, rank: int, numel: int, dtype, half: int | None = None, at: int = 0) -> torch.Tensor:
        base = self._slot_off + rank * self.slot_bytes + (0 if half is None else half * self.slot_bytes // 2)
        return self._view(base + at, numel, dtype)

    def _write_header(self, header: bytes, op_name: str) -> None:
        if len(header) + 4 > HEADER_BYTES:
            raise ValueError(f"{op_name}: collective header of {len(header)} bytes does not fit the shm slot")
        off = self._hdr_off + ((self._seq % 2) * self._size + self._rank) * HEADER_BYTES
        self._mm[off:off + 4 + len(header)] = struct.pack("<I", len(header)) + header

    def _read_headers(self) -> list[bytes]:
        out = []
        for j in range(self._size):  # parity by sequence number: the next collective writes the other set
            off = self._hdr_off + ((self._seq % 2) * self._size + j) * HEADER_BYTES
            (n,) = struct.unpack("<I", self._mm[off:off + 4])
            out.append(self._mm[off + 4:off + 4 + min(n, HEADER_BYTES - 4)])
        return out

    def _exchange_headers(self, header, op_name):
        self._write_header(header, op_name)
        self.counters.arrive_and_wait(op_name)
        return self._read_headers()

    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        """Every all-reduce carries its header in its first data barrier: one synchronisation fewer.

        Each rank writes only its own fixed-size header and data slots, so ranks that disagree cannot
        corrupt each other; they all see the mismatch right after that first barrier and raise together.
        After a collective whose ranks read peers' slots past its last barrier, the header gets its own
        round first (every rank knows this alike, so all still raise after the same barrier).
        """
        if self._size == 1 or not isinstance(tensor, torch.Tensor) or tensor.is_sparse:
            return super().all_reduce(tensor, op, async_op)
        tensor, op = reduced(tensor, op, "all_reduce")
        header = f"{desc(tensor)}|{op.name}"
        nbytes = tensor.numel() * tensor.element_size()
        symmetric = self.symmetric.offset(tensor)
        if symmetric is not None:  # ranks must agree on it (and the offset), or they would take different paths
            header += f"|symmetric@{symmetric}"
        single_copy = self._use_cma and nbytes >= self._cma_bytes
        small = not single_copy and nbytes <= SMALL_BYTES // self._size // LINE * LINE

        def body(_):
            mine = self._mine("all_reduce", header)
            self._write_header(f"{mine}#".encode(), "all_reduce")
            buf = contig(tensor)
            check: str | None = mine
            if self._slots_read_late:  # a peer may still read our slot for the last collective: own round
                self.counters.arrive_and_wait("all_reduce")
                self._check_headers("all_reduce", mine, self._read_headers())
                self._slots_read_late, check = False, None
            if symmetric is not None:
                self.symmetric.all_reduce(buf.view(-1), symmetric, op, check)
            elif small:
                self._small_all_reduce(buf.view(-1), op, check)
            elif single_copy:
                self.single_copy.all_reduce(buf.view(-1), op, check)
            else:
                self._all_reduce(buf.view(-1), op, check=check)
            if buf is not tensor:
                tensor.copy_(buf)
            return [tensor]
        return self._launch("all_reduce", body, async_op, agree=False)

    def _small_all_reduce(self, flat, op, mine):
        """Small tensors: one barrier, then every rank reduces the whole (tiny) vector.

        Every rank folds the N copies in the same order, so all get bitwise the same result; the staging
        area alternates by sequence number, so the next call never overwrites data a slow rank still reads.
        """
        per, parity = SMALL_BYTES // self._size // LINE * LINE, self._seq % 2
        slots = [self._view(self._small_off + (parity * self._size + j) * per, flat.numel(), flat.dtype)
                 for j in range(self._size)]
        slots[self._rank].copy_(flat)
        self.counters.arrive_and_wait("all_reduce")
        if mine is not None:
            self._check_headers("all_reduce", mine, self._read_headers())
        combine_(slots[0], slots[1], op, out=flat)
        for other in slots[2:]:
            combine_(flat, other, op)
        finish_avg_(flat, op, self._size)

    # collectives ---------------------------------------------------------------------------------
    def _rounds(self, numel: int, per_round: int):
        for a in range(0, numel, max(1, per_round)):
            yield a, min(numel, a + per_round)

    def _all_reduce(self, t, op, dst: int | None = None, check: str | None = None):
        """Per round: stage, barrier, reduce my slice, barrier, copy the others' slices out.

        For all-reduce, a rank's own slice never goes through shared memory on the way in (only it reads
        that slice) and is reduced in place in its own tensor, which cuts the copies by about a fifth.
        ``reduce`` keeps every input intact, so it stages everything and reduces into the result buffer.
        With ``check`` (this rank's header, already written) the first barrier doubles as the header round.
        """
        n, r, size = t.numel(), self._rank, self._size
        per = self.slot_bytes // t.element_size()
        in_place = dst is None
        for i, (a, b) in enumerate(self._rounds(n, per)):
            m, chunk = b - a, t[a:b]
            cuts = [(m * j) // size for j in range(size + 1)]
            lo, hi = cuts[r], cuts[r + 1]
            staged = self._slot(r, m, t.dtype)
            if in_place:
                staged[:lo].copy_(chunk[:lo])
                staged[hi:].copy_(chunk[hi:])
            else:
                staged.copy_(chunk)
            self.counters.arrive_and_wait("all_reduce")
            if check is not None and i == 0:
                self._check_headers("all_reduce", check, self._read_headers())
            res = self._view(self._res_off + (i % 2) * self.slot_bytes, m, t.dtype)
            if hi > lo:
                mine = chunk[lo:hi] if in_place else res[lo:hi]
                if not in_place:
                    mine.copy_(staged[lo:hi])
                for j in range(size):
                    if j != r:
                        combine_(mine, self._slot(j, m, t.dtype)[lo:hi], op)
                finish_avg_(mine, op, size)
                if in_place:
                    res[lo:hi].copy_(mine)
            self.counters.arrive_and_wait("all_reduce")
            if in_place:
                for j in range(size):
                    if j != r:
                        chunk[cuts[j]:cuts[j + 1]].copy_(res[cuts[j]:cuts[j + 1]])
            elif dst == r:
                chunk.copy_(res)

    def _reduce(self, t, dst, op):
        self._all_reduce(t, op, dst)
        self._slots_read_late = False

    def _single_copy(self, nbytes: int) -> bool:
        """Agreed by every rank alike: the verdict is the group's, the sizes passed the header check."""
        if self._use_cma and self._size > 1 and nbytes >= self._cma_bytes:
            self._slots_read_late = False  # the path ends on a barrier after which no slot is read
            return True
        return False

    def _broadcast(self, t, src):
        if self.symmetric.offset(t) is not None:
            self._slots_read_late = False
            return self.symmetric.broadcast(t, src)
        if self._single_copy(t.numel() * t.element_size()):
            return self.single_copy.broadcast(t, src)
        self._slots_read_late = True
        per = self.slot_bytes // 2 // t.element_size()
        for i, (a, b) in enumerate(self._rounds(t.numel(), per)):
            buf = self._slot(src, b - a, t.dtype, half=i % 2)
            if self._rank == src:
                buf.copy_(t[a:b])
            self.counters.arrive_and_wait("broadcast")
            if self._rank != src:
                t[a:b].copy_(buf)

    def _all_gather(self, out, inp):
        if self.symmetric.offset(inp) is not None:
            self._slots_read_late = False
            return self.symmetric.all_gather(out, inp)
        if self._single_copy(out.numel() * out.element_size()):
            return self.single_copy.all_gather(out, inp)
        self._staged_gather("all_gather", list(out.view(self._size, inp.numel())), inp)

    def _gather(self, outs, inp, dst):
        if self._single_copy(inp.numel() * inp.element_size() * self._size):
            return self.single_copy.gather(outs, inp, dst)
        self._staged_gather("gather", outs, inp)  # outs is empty but on dst

    def _staged_gather(self, op: str, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
        """Each rank stages a window of its input in its slot; ranks with ``outs`` copy every slot out."""
        self._slots_read_late = True
        per = self.slot_bytes // 2 // max(1, inp.element_size())
        for i, (a, b) in enumerate(self._rounds(inp.numel(), per)):
            self._slot(self._rank, b - a, inp.dtype, half=i % 2).copy_(inp[a:b])
            self.counters.arrive_and_wait(op)
            for j, o in enumerate(outs):
                o[a:b].copy_(self._slot(j, b - a, inp.dtype, half=i % 2))

    def _scatter(self, out, ins, src):
        if self._single_copy(out.numel() * out.element_size() * self._size):
            return self.single_copy.scatter(out, ins, src)
        self._slots_read_late = True
        per = self.slot_bytes // 2 // max(1, out.element_size())
        for i, (a, b) in enumerate(self._rounds(out.numel(), per)):
            for j, piece in enumerate(ins):  # only src has pieces: it fills every rank's slot
                self._slot(j, b - a, out.dtype, half=i % 2).copy_(piece[a:b])
            self.counters.arrive_and_wait("scatter")
            out[a:b].copy_(self._slot(self._rank, b - a, out.dtype, half=i % 2))

    def _reduce_scatter(self, out, inp, op):
        if self.symmetric.offset(inp) is not None:
            self._slots_read_late = False
            return self.symmetric.reduce_scatter(out, inp, op)
        if self._single_copy(inp.numel() * inp.element_size()):
            return self.single_copy.reduce_scatter(out, inp, op)
        self._slots_read_late = True
        m, size, r = out.numel(), self._size, self._rank
        per = self.slot_bytes // 2 // (size * out.element_size())
        for i, (a, b) in enumerate(self._rounds(m, per)):
            w = b - a
            staged = self._slot(r, size * w, inp.dtype, half=i % 2).view(size, w)
            staged.copy_(inp.view(size, m)[:, a:b])
            self.counters.arrive_and_wait("reduce_scatter_tensor")
            acc = out[a:b]
            acc.copy_(self._slot(0, size * w, inp.dtype, half=i % 2).view(size, w)[r])
            for j in range(1, size):
                combine_(acc, self._slot(j, size * w, inp.dtype, half=i % 2).view(size, w)[r], op)
            finish_avg_(acc, op, size)

    def _all_to_all(self, out, inp, out_splits, in_splits, longest):
        self._slots_read_late = True
        size, r, item = self._size, self._rank, inp.element_size()
        w = self.slot_bytes // 2 // (size * item)
        in_off = [sum(in_splits[:j]) for j in range(size)]
        out_off = [sum(out_splits[:j]) for j in range(size)]
        for i, (a, _) in enumerate(self._rounds(longest, w)):
            for j in range(size):  # stage the window [a, a+w) of the block for rank j at slot offset j*w
                k = max(0, min(in_splits[j], a + w) - a)
                if k:
                    self._slot(r, k, inp.dtype, half=i % 2, at=j * w * item).copy_(
                        inp[in_off[j] + a:in_off[j] + a + k])
            self.counters.arrive_and_wait("all_to_all_single")
            for j in range(size):
                k = max(0, min(out_splits[j], a + w) - a)
                if k:
                    out[out_off[j] + a:out_off[j] + a + k].copy_(
                        self._slot(j, k, inp.dtype, half=i % 2, at=r * w * item))

    def _barrier(self):
        """The header round every collective starts with is already a full barrier."""

    def _fence(self):
        self.counters.arrive_and_wait("fence")

    def _p2p(self, kind, t, peer, tag, copy_back=None):
        return self.mesh.p2p(kind, t, peer, tag, copy_back)

