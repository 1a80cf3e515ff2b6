"""Symmetric memory: tensors allocated inside one segment every rank maps, so peers load and store them directly.

The idea of torch's ``torch.distributed._symmetric_memory`` (and of NVSHMEM's symmetric heap): every rank
allocates the same sizes in the same order, so a buffer sits at the same offset in each rank's region of a
shared heap, and a peer's copy of it is a plain view at that offset. An all-reduce on such a tensor needs no
staging and no kernel copies: each rank reduces its 1/N slice straight from the peers' buffers and stores
the result straight into them, chunk by chunk while the chunk is in L2. All-gather, reduce-scatter (FSDP's
pair) and broadcast on a symmetric input read the peers' inputs where they lie, into a plain output.
Allocation is collective and never freed (a bump allocator): meant for long-lived buffers such as DDP's
gradient buckets and FSDP's flat parameters.
"""

from __future__ import annotations

import math
import os

import torch

from pt_dist._infra.shm_segment import map_shared_segment
from pt_dist.backends.arguments import lazy_view
from pt_dist.process_group import combiner, finish_avg_

HEAP_BYTES = int(os.environ.get("PT_DIST_SYMM_HEAP_BYTES", 1 << 30))  # per rank; pages appear when touched
CHUNK_BYTES = 256 << 10
ALIGN = 4096


class SymmetricHeap:
    """Rank j's region is ``[j * per_rank, (j + 1) * per_rank)`` of one segment mapped by the whole group."""

    def __init__(self, store, rank: int, size: int, timeout: float, group_name: str):
        self.rank, self.per_rank, self.group_name = rank, HEAP_BYTES - HEAP_BYTES % ALIGN, group_name
        self._mm, self._fd = map_shared_segment(store, rank, size, self.per_rank * size, "symm", timeout,
                                                group_name, keep_fd=True)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._mine = self._bytes.data_ptr() + rank * self.per_rank
        self._next = 0

    def allocate(self, nbytes: int) -> int:
        """The offset of ``nbytes`` more in every rank's region (page-aligned; an empty tensor takes no page)."""
        if self._next + nbytes > self.per_rank:
            raise ValueError(f"symmetric_empty: {nbytes} bytes do not fit the group {self.group_name!r} heap "
                             f"({self._next} of {self.per_rank} bytes per rank used); raise "
                             f"PT_DIST_SYMM_HEAP_BYTES before the first allocation")
        offset, padded = self._next, -(-nbytes // ALIGN) * ALIGN
        if padded == 0:
            return offset
        try:  # reserve the pages now: touching a page tmpfs has no room for would be a SIGBUS, not an error
            os.posix_fallocate(self._fd, self.rank * self.per_rank + offset, padded)
        except OSError as e:
            raise ValueError(f"symmetric_empty: no room for {nbytes} bytes in the shared-memory filesystem "
                             f"({e.strerror}); enlarge /dev/shm (docker run --shm-size) or allocate less") from e
        self._next += padded
        return offset

    def close(self) -> None:
        """With the group: the mapping lives on while tensors view it; the descriptor would hold the pages after."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def view(self, rank: int, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        start = rank * self.per_rank + offset
        return self._bytes[start:start + numel * dtype.itemsize].view(dtype)

    def offset_of(self, t: torch.Tensor) -> int | None:
        """Where ``t`` starts in this rank's region, if it is a contiguous tensor living there."""
        nbytes = t.numel() * t.element_size()
        if t.device.type != "cpu" or not t.is_contiguous() or nbytes == 0 or lazy_view(t):
            return None
        offset = t.data_ptr() - self._mine
        return offset if 0 <= offset and offset + nbytes <= self.per_rank else None


class SymmetricCollectives:
    """``ProcessGroupSHM``'s symmetric-memory allocation and all-reduce (it supplies the store and barriers)."""

    _heap: SymmetricHeap | None = None

    def symmetric_empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Collective: every rank allocates the same shapes in the same order (the first call maps the heap)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        if any(not isinstance(d, int) or d < 0 for d in shape):
            raise ValueError(f"symmetric_empty: shape {shape} must be non-negative integers")
        if self._heap is None:
            self._heap = SymmetricHeap(self._store, self._rank, self._size, self.timeout, self.group_name)
        numel = math.prod(shape)
        offset = self._heap.allocate(numel * dtype.itemsize)
        return self._heap.view(self._rank, offset, numel, dtype).view(shape)

    def symmetric_free_bytes(self) -> int:
        """Bytes still free in this rank's region (the same on every rank that allocated alike)."""
        if self._heap is None:
            return HEAP_BYTES - HEAP_BYTES % ALIGN
        return self._heap.per_rank - self._heap._next

    def shutdown(self) -> None:
        super().shutdown()
        if self._heap is not None:
            self._heap.close()

    def _symmetric_offset(self, t: torch.Tensor) -> int | None:
        return self._heap.offset_of(t) if self._heap is not None and self._size > 1 else None

    def _placement(self, t: torch.Tensor) -> tuple[str, str]:
        """All ranks must agree that the input is symmetric; each may hold it at its own offset (an in-place
        all-gather's input is each rank's own block of the output)."""
        offset = self._symmetric_offset(t)
        return ("", "") if offset is None else ("|symmetric", str(offset))

    def _input_of(self, j: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Rank j's input to the running collective, where it lies in j's region of the heap."""
        return self._heap.view(j, int(self._placed[j]), numel, dtype)

    def _symm_all_reduce(self, flat: torch.Tensor, offset: int, op, mine: str | None) -> None:
        """Rank r only writes slice r of its peers' buffers, which they never touch themselves, so nothing
        races; every slice is reduced once, so all ranks hold bitwise the same result."""
        self._arrive_and_wait("all_reduce")
        if mine is not None:
            self._check_headers("all_reduce", mine, self._read_headers())
        n, r, size = flat.numel(), self._rank, self._size
        peers = [self._heap.view(j, offset, n, flat.dtype) for j in range(size) if j != r]
        hi, step = (n * (r + 1)) // size, max(1, CHUNK_BYTES // flat.element_size())
        fold = combiner(op, flat.dtype)
        for a in range((n * r) // size, hi, step):
            b = min(hi, a + step)
            part = flat[a:b]
            for peer in peers:
                fold(part, peer[a:b], out=part)
            finish_avg_(part, op, size)
            for peer in peers:
                peer[a:b].copy_(part)
        self._arrive_and_wait("all_reduce")

    # Inputs are in place once the header round (a barrier) is over; the closing barrier says no one reads a
    # peer's input any more, so its owner may change it.
    def _symm_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        m = inp.numel()
        for j in range(self._size):
            if j != self._rank:  # (my own block may be my input itself: the in-place form)
                out[j * m:(j + 1) * m].copy_(self._input_of(j, m, inp.dtype))
            elif out.data_ptr() + j * m * inp.element_size() != inp.data_ptr():
                out[j * m:(j + 1) * m].copy_(inp)
        self._arrive_and_wait("all_gather")
        self._slots_read_late = False

    def _symm_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op) -> None:
        """Block r of every rank's input, folded into my output chunk by chunk, my own block first: in the
        in-place form it is the output itself, so it must be read before the output is written."""
        m, r = out.numel(), self._rank
        order = [r] + [j for j in range(self._size) if j != r]
        blocks = [self._input_of(j, inp.numel(), inp.dtype)[r * m:(r + 1) * m] for j in order]
        step, fold = max(1, CHUNK_BYTES // out.element_size()), combiner(op, out.dtype)
        for a in range(0, m, step):
            part = out[a:a + step]
            fold(blocks[0][a:a + step], blocks[1][a:a + step], out=part)
            for block in blocks[2:]:
                fold(part, block[a:a + step], out=part)
            finish_avg_(part, op, self._size)
        self._arrive_and_wait("reduce_scatter_tensor")
        self._slots_read_late = False

    def _symm_broadcast(self, t: torch.Tensor, src: int) -> None:
        if self._rank != src:
            t.copy_(self._input_of(src, t.numel(), t.dtype))
        self._arrive_and_wait("broadcast")
        self._slots_read_late = False
