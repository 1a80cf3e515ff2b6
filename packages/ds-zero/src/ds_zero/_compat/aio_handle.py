"""DeepSpeed's ``aio_handle`` interface (``deepspeed/ops/aio``, what its ``tests/unit/ops/aio/test_aio.py`` calls)
over :class:`ds_zero._infra.aio.AsyncIOHandle`: async calls return 0 and queue, ``wait()`` returns how many
completed, the sync calls return 1."""

from __future__ import annotations

import torch

from ds_zero._infra.aio import AsyncIOHandle as _AsyncIOHandle
from ds_zero._infra.aio import aligned_empty


class AsyncIOHandle(_AsyncIOHandle):
    def __init__(self, block_size: int = 1 << 20, queue_depth: int = 8, intra_op_parallelism: int = 1):
        super().__init__(block_size, queue_depth, intra_op_parallelism)
        self._queued: list = []

    def async_pwrite(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        self._queued.append(self.write(buffer, filename, file_offset))
        return 0

    def async_pread(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        self._queued.append(self.read(buffer, filename, file_offset))
        return 0

    def wait(self) -> int:
        queued, self._queued = self._queued, []
        for r in queued:
            r.wait()
        return len(queued)

    def sync_pwrite(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        self.write(buffer, filename, file_offset).wait()
        return 1

    def sync_pread(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        self.read(buffer, filename, file_offset).wait()
        return 1

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """An aligned host tensor (pinned when CUDA exists) of ``example_tensor``'s dtype."""
        return aligned_empty(num_elem, example_tensor.dtype, pin=torch.cuda.is_available())

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> None:
        del tensor  # freed with its last reference

    def get_block_size(self) -> int:
        return self.block_size

    def get_queue_depth(self) -> int:
        return self.queue_depth

    def get_intra_op_parallelism(self) -> int:
        return self.pool._max_workers
