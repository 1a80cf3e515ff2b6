"""Automatic prefix caching: content-addressed full blocks, kept after release and evicted LRU.

vLLM ``PrefixCachingBlockAllocator`` (block/prefix_caching_block.py) and ``evictor.py``. A *full* block is named
by a chained hash ``H(prev_block_hash, its token ids)``, so equal hashes mean an equal whole prefix. A new
sequence whose prompt hashes to a cached block shares it (ref count +1) instead of recomputing it. Released
cached blocks go to an ``LRUEvictor`` rather than the free list and are reused on a later hit; only when the
free list is empty is the least recently released one evicted (deepest block of a chain first). The hash is
SHA-256 (so whole-chain collisions are out of reach) and every hit also compares the block's own token ids and
previous hash, so a hash collision can cost a cache miss but never serve another prompt's KV.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from paged_serve.core.block import Device, PhysicalBlock
from paged_serve.core.block_allocator import BlockAllocator, NoFreeBlocksError

HashFn = Callable[[int | None, Sequence[int]], int]


def hash_block_tokens(prev_block_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained block hash: SHA-256 of the previous block's hash and this block's token ids, as a 128-bit int."""
    prev = (prev_block_hash or 0).to_bytes(16, "little")
    flag = b"\x01" if prev_block_hash is not None else b"\x00"
    digest = hashlib.sha256(flag + prev + array("q", token_ids).tobytes()).digest()
    return int.from_bytes(digest[:16], "little")


class LRUEvictor:
    """Released cached blocks in release order; ``evict`` pops the least recently released one.

    The block manager releases a sequence's blocks last-to-first, so within one release the deepest block of a
    chain leaves first, as vLLM's evictor prefers (its prefix may still be useful to a shorter prompt).
    """

    def __init__(self):
        self._blocks: OrderedDict[int, PhysicalBlock] = OrderedDict()

    def add(self, block: PhysicalBlock) -> None:
        self._blocks[block.block_hash] = block

    def remove(self, block_hash: int) -> PhysicalBlock:
        return self._blocks.pop(block_hash)

    def evict(self) -> PhysicalBlock:
        if not self._blocks:
            raise NoFreeBlocksError("no evictable cached blocks")
        _, block = self._blocks.popitem(last=False)
        return block

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> list[PhysicalBlock]:
        return list(self._blocks.values())


class PrefixCachingBlockAllocator(BlockAllocator):
    """A ``BlockAllocator`` whose full, computed blocks stay addressable by content hash until evicted."""

    def __init__(self, device: Device, block_size: int, num_blocks: int):
        super().__init__(device, block_size, num_blocks)
        self.cached_blocks: dict[int, PhysicalBlock] = {}
        self.evictor = LRUEvictor()
        self.num_queries = 0
        self.num_hits = 0
        self._clock = 0

    def _take_fresh(self) -> PhysicalBlock:
        if not self._free and len(self.evictor):
            victim = self.evictor.evict()
            del self.cached_blocks[victim.block_hash]
            victim.clear_content()
            self._free.append(victim)
        return super()._take_fresh()

    def _lookup(self, block_hash: int, prev_block_hash: int | None, token_ids: tuple[int, ...]) -> PhysicalBlock | None:
        block = self.cached_blocks.get(block_hash)
        if block is None or block.token_ids != token_ids or block.prev_block_hash != prev_block_hash:
            return None  # absent, or a hash collision: never hand out different content
        return block

    def is_in_use(self, block_hash: int, prev_block_hash: int | None, token_ids: Sequence[int]) -> bool:
        """Whether a live sequence holds a cached block with this content (sharing it costs no free block)."""
        block = self._lookup(block_hash, prev_block_hash, tuple(token_ids))
        return block is not None and block.ref_count > 0

    def _acquire(self, block: PhysicalBlock) -> None:
        if block.ref_count == 0:
            self.evictor.remove(block.block_hash)
        block.ref_count += 1

    def _register(self, block: PhysicalBlock, block_hash: int, prev_block_hash: int | None, token_ids) -> None:
        block.block_hash = block_hash
        block.prev_block_hash = prev_block_hash
        block.token_ids = token_ids
        self.cached_blocks[block_hash] = block

    def allocate_cached(self, block_hash: int, prev_block_hash: int | None, token_ids: Sequence[int]) -> PhysicalBlock:
        """A full prompt block: the cached one with this content if any (a hit), else a fresh registered block."""
        token_ids = tuple(token_ids)
        self.num_queries += 1
        block = self._lookup(block_hash, prev_block_hash, token_ids)
        if block is not None:
            self.num_hits += 1
            self._acquire(block)
            return block
        block = self.allocate()
        if block_hash not in self.cached_blocks:
            self._register(block, block_hash, prev_block_hash, token_ids)
        return block

    def promote(
        self, block: PhysicalBlock, block_hash: int, prev_block_hash: int | None, token_ids: Sequence[int]
    ) -> PhysicalBlock:
        """A mutable block just filled with computed KV: merge it into an identical cached block, else cache it.

        Returns the block the sequence should now use; on a merge the caller's reference moves to the cached
        block and ``block`` loses one reference (it is usually freed, its KV being a duplicate).
        """
        self._check_owned(block)
        token_ids = tuple(token_ids)
        block.computed = True
        cached = self._lookup(block_hash, prev_block_hash, token_ids)
        if cached is block:
            return block
        if cached is not None and cached.computed:
            self._acquire(cached)
            self.free(block)
            return cached
        if block_hash not in self.cached_blocks and block.block_hash is None:
            self._register(block, block_hash, prev_block_hash, token_ids)
        return block

    def register(
        self, block: PhysicalBlock, block_hash: int, prev_block_hash: int | None, token_ids: Sequence[int]
    ) -> None:
        """Make an allocated block with known, computed content (e.g. just swapped in) findable, if not already."""
        self._check_owned(block)
        block.computed = True
        if block_hash not in self.cached_blocks and block.block_hash is None:
            self._register(block, block_hash, prev_block_hash, tuple(token_ids))

    def _release(self, block: PhysicalBlock) -> None:
        if block.block_hash is not None and block.computed and self.cached_blocks.get(block.block_hash) is block:
            self._clock += 1
            block.last_accessed = self._clock
            self.evictor.add(block)
            return
        if block.block_hash is not None and self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]  # registered but never computed: its KV is garbage
        super()._release(block)

    def get_num_free_blocks(self) -> int:
        return len(self._free) + len(self.evictor)

    def get_prefix_cache_hit_rate(self) -> float:
        """Hits / lookups of full prompt blocks since creation (0.0 before any lookup)."""
        return self.num_hits / self.num_queries if self.num_queries else 0.0
