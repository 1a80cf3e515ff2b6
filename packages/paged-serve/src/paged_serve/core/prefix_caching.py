"""Automatic prefix caching: content-addressed full blocks, kept after release and evicted LRU.

vLLM ``PrefixCachingBlockAllocator`` (block/prefix_caching_block.py) and ``evictor.py``. A *full* block is named
by a chained hash ``H(prev_block_hash, its token ids)``, so equal hashes mean an equal whole prefix. A new
sequence whose prompt hashes to a cached block shares it (ref count +1) instead of recomputing it. Released
cached blocks go to an ``LRUEvictor`` rather than the free list and are reused on a later hit; only when the
free list is empty is the least recently released one evicted (deepest block of a chain first). The hash is
SHA-256 (so whole-chain collisions are out of reach) and every hit also compares the block's own token ids and its
physical predecessor (the block the asking sequence holds one position earlier, unchanged since this block was
cached), so a hash collision anywhere in a chain can cost a cache miss but never serve KV of another prefix. Since
that predecessor must itself have been a hit, a lookup chain stops at its first miss.
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
    """A ``BlockAllocator`` whose full, computed blocks stay addressable by content hash until evicted.

    Every lookup names the block the asking sequence holds just before (``parent``, ``None`` for block 0): a cached
    block serves only sequences whose previous block is the very block it was cached after, with that block's
    content unchanged since (``PhysicalBlock.version``).
    """

    def __init__(self, device: Device, block_size: int, num_blocks: int):
        super().__init__(device, block_size, num_blocks)
        self.cached_blocks: dict[int, PhysicalBlock] = {}
        self.evictor = LRUEvictor()
        self.num_queries = 0
        self.num_hits = 0

    def _take_fresh(self) -> PhysicalBlock:
        if not self._free and len(self.evictor):
            victim = self.evictor.evict()
            del self.cached_blocks[victim.block_hash]
            victim.clear_content()
            self._free.append(victim)
        return super()._take_fresh()

    @staticmethod
    def _is_stale(block: PhysicalBlock) -> bool:
        """A cached block whose predecessor's content has changed since: its KV belongs to no live prefix."""
        return block.parent is not None and block.parent.version != block.parent_version

    def lookup(self, block_hash: int, token_ids: Sequence[int], parent: PhysicalBlock | None) -> PhysicalBlock | None:
        """The cached block holding ``token_ids`` right after ``parent``, or ``None`` (absent, collision, stale)."""
        block = self.cached_blocks.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids) or block.parent is not parent or self._is_stale(block):
            return None
        return block

    def _acquire(self, block: PhysicalBlock) -> None:
        if block.ref_count == 0:
            self.evictor.remove(block.block_hash)
        block.ref_count += 1

    def _register(self, block: PhysicalBlock, block_hash: int, token_ids, parent: PhysicalBlock | None) -> None:
        """Make ``block`` the cache entry for ``block_hash``, unless a live entry already holds that hash."""
        if block.block_hash is not None:
            return
        old = self.cached_blocks.get(block_hash)
        if old is not None:
            if not self._is_stale(old):
                return
            del self.cached_blocks[block_hash]  # an in-use stale block keeps its KV for its holders, uncached
            if old.ref_count == 0:
                self.evictor.remove(block_hash)
                super()._release(old)
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        block.parent = parent
        block.parent_version = parent.version if parent is not None else 0
        self.cached_blocks[block_hash] = block

    def allocate_cached(
        self, block_hash: int, token_ids: Sequence[int], parent: PhysicalBlock | None = None
    ) -> PhysicalBlock:
        """A full prompt block: the cached one with this content after ``parent`` (a hit), else a fresh one
        registered under the hash (its KV is written by the coming prefill)."""
        self.num_queries += 1
        block = self.lookup(block_hash, token_ids, parent)
        if block is not None:
            self.num_hits += 1
            self._acquire(block)
            return block
        block = self.allocate()
        self._register(block, block_hash, token_ids, parent)
        return block

    def promote(
        self, block: PhysicalBlock, block_hash: int, token_ids: Sequence[int], parent: PhysicalBlock | None
    ) -> PhysicalBlock:
        """A full block whose KV was just computed: merge it into an identical cached block, else cache it.

        Returns the block the sequence should now use; on a merge the caller's reference moves to the cached
        block and ``block`` loses one reference (it is usually freed, its KV being a duplicate).
        """
        self._check_owned(block)
        block.computed = True
        cached = self.lookup(block_hash, token_ids, parent)
        if cached is block:
            return block
        if cached is not None and cached.computed:
            self._acquire(cached)
            self.free(block)
            return cached
        self._register(block, block_hash, token_ids, parent)
        return block

    def register(
        self, block: PhysicalBlock, block_hash: int, token_ids: Sequence[int], parent: PhysicalBlock | None
    ) -> None:
        """Make an allocated block with known, computed content (e.g. just swapped in) findable, if not already."""
        self._check_owned(block)
        if not block.computed:
            raise ValueError(f"{block} holds no computed KV: it cannot be cached")
        self._register(block, block_hash, token_ids, parent)

    def _release(self, block: PhysicalBlock) -> None:
        if block.block_hash is not None and self.cached_blocks.get(block.block_hash) is block:
            if block.computed and not self._is_stale(block):
                self.evictor.add(block)
                return
            del self.cached_blocks[block.block_hash]  # never computed (garbage KV) or stale: not worth keeping
        super()._release(block)

    def get_num_free_blocks(self) -> int:
        return len(self._free) + len(self.evictor)

    def get_prefix_cache_hit_rate(self) -> float:
        """Hits / lookups of full prompt blocks since creation (0.0 before any lookup)."""
        return self.num_hits / self.num_queries if self.num_queries else 0.0
