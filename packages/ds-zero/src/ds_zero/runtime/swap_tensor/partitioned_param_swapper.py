"""ZeRO-3 parameter partitions on NVMe (ZeRO-Infinity; DeepSpeed's ``AsyncPartitionedParameterSwapper``).

Each parameter's partition (this rank's chunk, low precision) lives in its own file, padded to 4 KiB. Between
uses ``param.ds_tensor`` is an empty placeholder; ``swap_in`` reads the partition into one of
``buffer_count`` aligned host buffers (``buffer_size`` elements each) just before the all-gather, ahead of
time when the coordinator prefetches (``async_op``), and ``release`` hands the buffer back once the full
parameter is gathered. ``write`` stores an updated partition after the optimizer step.
"""

from __future__ import annotations

import os

import torch

from ds_zero._infra.aio import AsyncIOHandle, aligned_empty, round_up


class AsyncPartitionedParameterSwapper:
    def __init__(self, params: list, folder: str, aio: AsyncIOHandle, buffer_count: int, buffer_size: int,
                 dtype: torch.dtype, pin: bool):
        self.aio, self.folder, self.dtype = aio, folder, dtype
        os.makedirs(folder, exist_ok=True)
        self.esize = torch.empty(0, dtype=dtype).element_size()
        self.numel = {p.ds_id: p.ds_tensor.numel() for p in params}
        largest = max(self.numel.values(), default=1)
        if largest > buffer_size:
            raise ValueError(f"config key 'zero_optimization.offload_param.buffer_size' has invalid value "
                             f"{buffer_size}; allowed: at least the largest partition, {largest} elements")
        # No bigger than the largest partition: with small models the default 1e8-element buffers would be waste.
        self.buffer_numel = round_up(largest * self.esize) // self.esize
        self.buffers = [aligned_empty(self.buffer_numel, dtype, pin) for _ in range(max(1, buffer_count))]
        self.free = list(range(len(self.buffers)))
        self.holding: dict[int, int] = {}  # ds_id -> buffer index
        self.reads: dict[int, object] = {}  # ds_id -> pending read
        self.paths = {pid: os.path.join(folder, f"param_{pid}.swp") for pid in self.numel}
        for pid, n in self.numel.items():
            aio.reserve(self.paths[pid], round_up(n * self.esize))
        self.placeholder = torch.empty(0, dtype=dtype)
        self._params = list(params)
        for p in params:
            p.ds_swapper = self  # gather_params and repartition_param read and write through it

    def file_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths.values() if os.path.exists(p))

    def _padded(self, pid: int) -> int:
        return round_up(self.numel[pid] * self.esize) // self.esize

    def write(self, p, values: torch.Tensor) -> object:
        """Store ``values`` (this rank's partition, in an aligned buffer padded to 4 KiB) as p's file."""
        return self.aio.write(values[:self._padded(p.ds_id)], self.paths[p.ds_id])

    def capacity(self) -> int:
        """How many more partitions fit now (free buffers)."""
        return len(self.free)

    def write_resident(self, p) -> None:
        """Write p's swapped-in (and modified) partition back to its file."""
        self.write(p, self.buffers[self.holding[p.ds_id]]).wait()

    def swap_in(self, params, async_op: bool = False) -> None:
        for p in params:
            pid = p.ds_id
            if pid in self.holding:
                if not async_op and pid in self.reads:
                    self.reads.pop(pid).wait()
                    self._install(p)
                continue
            if not self.free:
                if async_op:
                    return  # prefetch only what fits; the rest is read on demand
                raise RuntimeError(f"all {len(self.buffers)} parameter swap buffers are in use; raise "
                                   "zero_optimization.offload_param.buffer_count")
            i = self.free.pop()
            self.holding[pid] = i
            req = self.aio.read(self.buffers[i][:self._padded(pid)], self.paths[pid])
            if async_op:
                self.reads[pid] = req
            else:
                req.wait()
                self._install(p)

    def _install(self, p) -> None:
        p.ds_tensor = self.buffers[self.holding[p.ds_id]][:self.numel[p.ds_id]]

    def release(self, params) -> None:
        for p in params:
            if p.ds_id in self.holding and p.ds_id not in self.reads:
                self.free.append(self.holding.pop(p.ds_id))
                p.ds_tensor = self.placeholder

    def drain(self) -> None:
        """Finish prefetches nobody used (the order changed) and hand their buffers back."""
        for pid in list(self.reads):
            self.reads.pop(pid).wait()
            self.free.append(self.holding.pop(pid))

    def close(self) -> None:
        self.drain()
        for p in list(getattr(self, "_params", [])):
            p.ds_swapper = None
        for path in self.paths.values():
            if os.path.exists(path):
                os.unlink(path)
