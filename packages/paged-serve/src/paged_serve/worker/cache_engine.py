"""``CacheEngine`` (vLLM ``worker/cache_engine.py``): the KV cache tensors of every layer, on the device and on CPU.

Each layer owns a key and a value cache ``[num_blocks, block_size, num_kv_heads, head_size]`` on the device (the
"GPU" pool, wherever the model runs) and the same on CPU for swapped-out blocks (pinned when the device is CUDA).
The block manager decides which blocks move; this class moves them: ``swap_out``/``swap_in`` between the pools,
``copy`` for copy-on-write inside the device pool.
"""

from __future__ import annotations

import torch

from paged_serve.ops import paged_attn


class CacheEngine:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.block_size = block_size
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        shape = (block_size, num_kv_heads, head_size)
        pin = device.type == "cuda"
        self.gpu_cache = [
            (
                torch.empty((num_gpu_blocks, *shape), dtype=dtype, device=device),
                torch.empty((num_gpu_blocks, *shape), dtype=dtype, device=device),
            )
            for _ in range(num_layers)
        ]
        self.cpu_cache = [
            (
                torch.empty((num_cpu_blocks, *shape), dtype=dtype, pin_memory=pin),
                torch.empty((num_cpu_blocks, *shape), dtype=dtype, pin_memory=pin),
            )
            for _ in range(num_layers)
        ]

    @staticmethod
    def get_cache_block_size(block_size: int, num_layers: int, num_kv_heads: int, head_size: int, dtype) -> int:
        """Bytes one block takes across all layers, keys and values."""
        return 2 * num_layers * block_size * num_kv_heads * head_size * torch.empty((), dtype=dtype).element_size()

    def _swap(self, src, dst, mapping: list[tuple[int, int]]) -> None:
        if not mapping:
            return
        table = torch.tensor(mapping, dtype=torch.int64)
        for (src_k, src_v), (dst_k, dst_v) in zip(src, dst):
            paged_attn.swap_blocks(src_k, dst_k, table)
            paged_attn.swap_blocks(src_v, dst_v, table)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        self._swap(self.gpu_cache, self.cpu_cache, mapping)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        self._swap(self.cpu_cache, self.gpu_cache, mapping)

    def copy(self, mapping: list[tuple[int, int]]) -> None:
        if mapping:
            paged_attn.copy_blocks([k for k, _ in self.gpu_cache], [v for _, v in self.gpu_cache], mapping)

    def num_bytes(self) -> dict[str, int]:
        """Summed tensor bytes of each pool."""
        count = lambda cache: sum(t.numel() * t.element_size() for kv in cache for t in kv)  # noqa: E731
        return {"gpu": count(self.gpu_cache), "cpu": count(self.cpu_cache)}
