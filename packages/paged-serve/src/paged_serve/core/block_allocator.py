"""``BlockAllocator``: one device's pool of KV blocks, with a free list and reference counts.

vLLM ``UncachedBlockAllocator`` (block_manager_v1) / ``NaiveBlockAllocator`` (block/naive_block.py): a block is
handed out with ``ref_count`` 1, ``incr_ref`` shares it (fork), ``free`` drops one reference and returns the block
to the free list at zero. Misuse raises instead of corrupting the pool.
"""

from __future__ import annotations

from collections import deque

from paged_serve.core.block import Device, PhysicalBlock


class NoFreeBlocksError(ValueError):
    """The pool has no free block left for a request that was not checked with ``can_*`` first."""


class DoubleFreeError(ValueError):
    """A block was freed more often than it was allocated or shared."""


class BlockAllocator:
    """The free list and reference counts of ``num_blocks`` physical blocks on ``device``."""

    def __init__(self, device: Device, block_size: int, num_blocks: int):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.blocks = [PhysicalBlock(device, i, block_size) for i in range(num_blocks)]
        self._free: deque[PhysicalBlock] = deque(self.blocks)

    @property
    def free_blocks(self) -> list[PhysicalBlock]:
        """Blocks on the free list (not counting any cached-but-evictable ones)."""
        return list(self._free)

    def _take_fresh(self) -> PhysicalBlock:
        if not self._free:
            raise NoFreeBlocksError(f"no free {self.device.name} blocks: all {self.num_blocks} are in use")
        block = self._free.popleft()
        block.clear_content()
        return block

    def allocate(self) -> PhysicalBlock:
        """A block holding nothing yet (a mutable block: the tokens it will hold are not known), ``ref_count`` 1."""
        block = self._take_fresh()
        block.ref_count = 1
        return block

    def _check_owned(self, block: PhysicalBlock) -> None:
        if block.device != self.device or not 0 <= block.block_number < self.num_blocks:
            raise ValueError(f"{block} does not belong to this {self.device.name} allocator")
        if self.blocks[block.block_number] is not block:
            raise ValueError(f"{block} is not this allocator's block object")

    def incr_ref(self, block: PhysicalBlock) -> None:
        """Share an allocated block with one more sequence (fork)."""
        self._check_owned(block)
        if block.ref_count <= 0:
            raise ValueError(f"cannot share {block}: it is free")
        block.ref_count += 1

    def free(self, block: PhysicalBlock) -> None:
        """Drop one reference; at zero the block becomes free."""
        self._check_owned(block)
        if block.ref_count <= 0:
            raise DoubleFreeError(f"double free of {block}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self._release(block)

    def _release(self, block: PhysicalBlock) -> None:
        block.clear_content()
        self._free.append(block)

    def get_num_free_blocks(self) -> int:
        return len(self._free)

    def get_num_total_blocks(self) -> int:
        return self.num_blocks

    def get_prefix_cache_hit_rate(self) -> float:
        """-1: this allocator does no prefix caching (vLLM's convention)."""
        return -1.0
