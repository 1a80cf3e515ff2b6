"""Symmetric memory on the shm group: tensors allocated in the group's symmetric heap (``_infra/symmetric_heap.py``),
so peers load and store them directly.

An all-reduce on such a tensor needs no staging and no kernel copies: each rank reduces its 1/N slice straight
from the peers' buffers and stores the result straight into them, chunk by chunk while the chunk is in L2.
All-gather, reduce-scatter (FSDP's pair) and broadcast on a symmetric input read the peers' inputs where they lie,
into a plain output. Meant for long-lived buffers such as DDP's gradient buckets and FSDP's flat parameters.
"""

from __future__ import annotations

import math

import torch

from pt_dist._infra.symmetric_heap import ALIGN, HEAP_BYTES, SymmetricHeap

CHUNK_BYTES = 256 << 10


class SymmetricMemory:
    """``pg`` is the ``ProcessGroupSHM`` (its store maps the heap on first use; its counters are the barriers);
    ``combiner(op, dtype)`` and ``finish_avg_(t, op, world)`` are its reduction arithmetic (``process_group.py``)."""

    def __init__(self, pg, combiner, finish_avg_):
        self.pg, self.combiner, self.finish_avg_ = pg, combiner, finish_avg_
        self.heap: SymmetricHeap | None = None

    def empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Collective: every rank allocates the same shapes in the same order (the first call maps the heap)."""
        pg = self.pg
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        if any(not isinstance(d, int) or d < 0 for d in shape):
            raise ValueError(f"symmetric_empty: shape {shape} must be non-negative integers")
        if self.heap is None:
            self.heap = SymmetricHeap(pg._store, pg._rank, pg._size, pg.timeout, pg.group_name)
        numel = math.prod(shape)
        offset = self.heap.allocate(numel * dtype.itemsize)
        return self.heap.view(pg._rank, offset, numel, dtype).view(shape)

    def free_bytes(self) -> int:
        """Bytes still free in this rank's region (the same on every rank that allocated alike)."""
        return HEAP_BYTES - HEAP_BYTES % ALIGN if self.heap is None else self.heap.free_bytes()

    def close(self) -> None:
        if self.heap is not None:
            self.heap.close()

    def offset(self, t: torch.Tensor) -> int | None:
        """Where ``t`` starts in this rank's region, if it lives in the heap (and there are peers to share it)."""
        return self.heap.offset_of(t) if self.heap is not None and self.pg._size > 1 else None

    def placement(self, t: torch.Tensor) -> tuple[str, str]:
        """All ranks must agree that the input is symmetric; each may hold it at its own offset (an in-place
        all-gather's input is each rank's own block of the output)."""
        offset = self.offset(t)
        return ("", "") if offset is None else ("|symmetric", str(offset))

    def _input_of(self, j: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Rank j's input to the running collective, where it lies in j's region of the heap."""
        return self.heap.view(j, int(self.pg._placed[j]), numel, dtype)

    def all_reduce(self, flat: torch.Tensor, offset: int, op, mine: str | None) -> None:
        """Rank r only writes slice r of its peers' buffers, which they never touch themselves, so nothing
        races; every slice is reduced once, so all ranks hold bitwise the same result."""
        pg = self.pg
        pg.counters.arrive_and_wait("all_reduce")
        if mine is not None:
            pg._check_headers("all_reduce", mine, pg._read_headers())
        n, r, size = flat.numel(), pg._rank, pg._size
        peers = [self.heap.view(j, offset, n, flat.dtype) for j in range(size) if j != r]
        hi, step = (n * (r + 1)) // size, max(1, CHUNK_BYTES // flat.element_size())
        fold = self.combiner(op, flat.dtype)
        for a in range((n * r) // size, hi, step):
            b = min(hi, a + step)
            part = flat[a:b]
            for peer in peers:
                fold(part, peer[a:b], out=part)
            self.finish_avg_(part, op, size)
            for peer in peers:
                peer[a:b].copy_(part)
        pg.counters.arrive_and_wait("all_reduce")

    # Inputs are in place once the header round (a barrier) is over; the closing barrier says no one reads a
    # peer's input any more, so its owner may change it.
    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        m, r = inp.numel(), self.pg._rank
        for j in range(self.pg._size):
            if j != r:  # (my own block may be my input itself: the in-place form)
                out[j * m:(j + 1) * m].copy_(self._input_of(j, m, inp.dtype))
            elif out.data_ptr() + j * m * inp.element_size() != inp.data_ptr():
                out[j * m:(j + 1) * m].copy_(inp)
        self.pg.counters.arrive_and_wait("all_gather")

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op) -> None:
        """Block r of every rank's input, folded into my output chunk by chunk, my own block first: in the
        in-place form it is the output itself, so it must be read before the output is written."""
        m, r, size = out.numel(), self.pg._rank, self.pg._size
        order = [r] + [j for j in range(size) if j != r]
        blocks = [self._input_of(j, inp.numel(), inp.dtype)[r * m:(r + 1) * m] for j in order]
        step, fold = max(1, CHUNK_BYTES // out.element_size()), self.combiner(op, out.dtype)
        for a in range(0, m, step):
            part = out[a:a + step]
            fold(blocks[0][a:a + step], blocks[1][a:a + step], out=part)
            for block in blocks[2:]:
                fold(part, block[a:a + step], out=part)
            self.finish_avg_(part, op, size)
        self.pg.counters.arrive_and_wait("reduce_scatter_tensor")

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        if self.pg._rank != src:
            t.copy_(self._input_of(src, t.numel(), t.dtype))
        self.pg.counters.arrive_and_wait("broadcast")
