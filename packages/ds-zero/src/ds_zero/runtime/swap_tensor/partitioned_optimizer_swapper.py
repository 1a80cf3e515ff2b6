"""Optimizer states on NVMe (ZeRO-Infinity; DeepSpeed's ``PartitionedOptimizerSwapper`` and
``PipelinedOptimizerSwapper`` in ``deepspeed/runtime/swap_tensor``).

Each sub-group's fp32 master, Adam momentum and variance live in one file under ``nvme_path``, the three
segments at 4 KiB-aligned offsets so one ``O_DIRECT`` transfer moves them. ``buffer_count`` aligned host
buffers hold the sub-groups being stepped: ``swap_in(k)`` reads into a free buffer, ``swap_out(k)`` writes
it back; with ``pipeline_read`` the next sub-group is read while this one is stepped, with
``pipeline_write`` the write finishes in the background (a buffer is reused only after its write).
"""

from __future__ import annotations

import os

import torch

from ds_zero._infra.aio import AsyncIOHandle, aligned_empty, round_up


class PartitionedOptimizerSwapper:
    def __init__(self, sizes: list[int], folder: str, aio: AsyncIOHandle, buffer_count: int, pin: bool):
        self.sizes = list(sizes)  # elements per sub-group
        self.aio = aio
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.paths = [os.path.join(folder, f"optimizer_subgroup_{k}.swp") for k in range(len(sizes))]
        self.segment = [round_up(n * 4) // 4 for n in sizes]  # aligned fp32 elements per segment
        largest = max(self.segment, default=1)
        self.buffers = [aligned_empty(3 * largest, torch.float32, pin) for _ in range(max(2, buffer_count))]
        self.owner: list[int | None] = [None] * len(self.buffers)  # sub-group a buffer holds
        self.reads: dict[int, object] = {}  # sub-group -> pending read
        self.writes: dict[int, object] = {}  # buffer index -> pending write
        for path, seg in zip(self.paths, self.segment):
            aio.reserve(path, 3 * seg * 4)

    def file_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths if os.path.exists(p))

    def views(self, k: int, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, seg = self.sizes[k], self.segment[k]
        return buf[:n], buf[seg:seg + n], buf[2 * seg:2 * seg + n]

    def _free_buffer(self, avoid: set[int]) -> int:
        for i, owner in enumerate(self.owner):
            if owner is None and i not in avoid:
                self._finish_write(i)
                return i
        raise RuntimeError(f"all {len(self.buffers)} optimizer swap buffers hold sub-groups not yet written back; "
                           "raise zero_optimization.offload_optimizer.buffer_count")

    def _finish_write(self, i: int) -> None:
        req = self.writes.pop(i, None)
        if req is not None:
            req.wait()

    def swap_in(self, k: int, async_op: bool = False, avoid: set[int] = frozenset()) -> int:
        """Start (or finish) reading sub-group k; returns the buffer index holding it."""
        for i, owner in enumerate(self.owner):
            if owner == k:
                if not async_op and k in self.reads:
                    self.reads.pop(k).wait()
                return i
        i = self._free_buffer(set(avoid))
        self.owner[i] = k
        nbytes_elems = 3 * self.segment[k]
        req = self.aio.read(self.buffers[i][:nbytes_elems], self.paths[k])
        if async_op:
            self.reads[k] = req
        else:
            req.wait()
        return i

    def swap_out(self, k: int, i: int, async_op: bool = False) -> None:
        req = self.aio.write(self.buffers[i][:3 * self.segment[k]], self.paths[k])
        self.owner[i] = None
        if async_op:
            self.writes[i] = req
        else:
            req.wait()

    def write_initial(self, k: int, master: torch.Tensor, fast: bool) -> None:
        """Sub-group k's first state: the given master, zero moments (``fast_init``: writes overlap)."""
        i = self._free_buffer(set())
        buf = self.buffers[i][:3 * self.segment[k]]
        buf.zero_()
        self.views(k, buf)[0].copy_(master)
        self.owner[i] = k
        self.swap_out(k, i, async_op=fast)

    def drain(self) -> None:
        for k in list(self.reads):
            self.reads.pop(k).wait()
        for i in list(self.writes):
            self._finish_write(i)

    def close(self) -> None:
        self.drain()
        for path in self.paths:
            if os.path.exists(path):
                os.unlink(path)
