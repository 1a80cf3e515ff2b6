"""vLLM's KV-cache memory management: physical blocks, allocators, prefix caching and the BlockSpaceManager."""

from paged_serve.core.block import BlockTable, Device, PhysicalBlock
from paged_serve.core.block_allocator import BlockAllocator, DoubleFreeError, NoFreeBlocksError
from paged_serve.core.block_manager import AllocStatus, BlockSpaceManager, UnknownSequenceError
from paged_serve.core.prefix_caching import LRUEvictor, PrefixCachingBlockAllocator, hash_block_tokens
from paged_serve.core.sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = [
    "AllocStatus",
    "BlockAllocator",
    "BlockSpaceManager",
    "BlockTable",
    "Device",
    "DoubleFreeError",
    "LRUEvictor",
    "NoFreeBlocksError",
    "PhysicalBlock",
    "PrefixCachingBlockAllocator",
    "Sequence",
    "SequenceGroup",
    "SequenceStatus",
    "UnknownSequenceError",
    "hash_block_tokens",
]
