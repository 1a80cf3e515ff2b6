"""The symmetric heap: one segment every rank of a group maps, each rank allocating the same sizes in the same
order, so a buffer sits at the same offset in each rank's region and a peer's copy of it is a plain view (the
idea of torch's ``torch.distributed._symmetric_memory`` and of NVSHMEM's symmetric heap). Allocation is
collective and never freed (a bump allocator). The collectives that read peers' buffers in place are
``symmetric_memory.py``.
"""

from __future__ import annotations

import os

import torch

from pt_dist._infra.shm_segment import map_shared_segment

HEAP_BYTES = int(os.environ.get("PT_DIST_SYMM_HEAP_BYTES", 1 << 30))  # per rank; pages appear when touched
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
        if t.device.type != "cpu" or not t.is_contiguous() or nbytes == 0 or t.is_conj() or t.is_neg():
            return None
        offset = t.data_ptr() - self._mine
        return offset if 0 <= offset and offset + nbytes <= self.per_rank else None

    def free_bytes(self) -> int:
        return self.per_rank - self._next
