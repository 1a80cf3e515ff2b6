"""BlockAllocator: free list and ref counts (mirrors vLLM's test_block_allocator_allocate/free)."""

from __future__ import annotations

import pytest
from paged_serve.core import BlockAllocator, Device, DoubleFreeError, NoFreeBlocksError


def test_block_allocator_allocate():
    allocator = BlockAllocator(Device.CPU, block_size=4, num_blocks=4)
    num_free = 4
    assert allocator.get_num_free_blocks() == num_free
    seen = set()
    for _ in range(4):
        block = allocator.allocate()
        num_free -= 1
        assert block not in allocator.free_blocks and block.ref_count == 1
        assert allocator.get_num_free_blocks() == num_free
        seen.add(block.block_number)
    assert seen == {0, 1, 2, 3}
    with pytest.raises(NoFreeBlocksError, match="all 4"):
        allocator.allocate()


def test_block_allocator_free():
    allocator = BlockAllocator(Device.CPU, 4, 4)
    blocks = [allocator.allocate() for _ in range(4)]
    assert allocator.get_num_free_blocks() == 0
    for num_free, block in enumerate(blocks, start=1):
        allocator.free(block)
        assert block in allocator.free_blocks
        assert allocator.get_num_free_blocks() == num_free
        with pytest.raises(DoubleFreeError):
            allocator.free(block)


def test_shared_block_is_freed_by_its_last_reference():
    allocator = BlockAllocator(Device.GPU, 4, 2)
    block = allocator.allocate()
    allocator.incr_ref(block)
    allocator.free(block)
    assert allocator.get_num_free_blocks() == 1 and block.ref_count == 1
    allocator.free(block)
    assert allocator.get_num_free_blocks() == 2
    with pytest.raises(ValueError, match="free"):
        allocator.incr_ref(block)


def test_foreign_block_rejected():
    gpu, cpu = BlockAllocator(Device.GPU, 4, 2), BlockAllocator(Device.CPU, 4, 2)
    with pytest.raises(ValueError, match="does not belong"):
        cpu.free(gpu.allocate())
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(Device.GPU, 4, -1)
