"""Prefix caching: chained hashes, hit/miss, LRU eviction, merge of a just-filled block, collision safety."""

from __future__ import annotations

from paged_serve.core import (
    BlockSpaceManager,
    Device,
    LRUEvictor,
    PrefixCachingBlockAllocator,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    hash_block_tokens,
)


def _group(seq_id, tokens, block_size=4):
    seq = Sequence(seq_id, tokens, block_size)
    return seq, SequenceGroup(str(seq_id), [seq])


def _chain(tokens, block_size=4):
    hashes, prev = [], None
    for i in range(0, len(tokens) - len(tokens) % block_size, block_size):
        prev = hash_block_tokens(prev, tokens[i : i + block_size])
        hashes.append(prev)
    return hashes


def test_identical_chains_identical_hashes():
    a, b = list(range(12)), list(range(12))
    assert _chain(a) == _chain(b) and len(set(_chain(a))) == 3
    c = [99] + a[1:]  # only the first block differs: every later hash differs too (the chain carries the prefix)
    assert all(x != y for x, y in zip(_chain(a), _chain(c)))
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(0, [1, 2])


def test_prefix_sharing_all_but_last_block():
    manager = BlockSpaceManager(4, 16, 0, watermark=0, enable_caching=True)
    prompt = list(range(14))  # 3 full blocks + 2 tokens
    s1, g1 = _group(1, prompt)
    manager.allocate(g1)
    manager.mark_blocks_as_computed(g1)
    s2, g2 = _group(2, prompt)
    free_before = manager.get_num_free_gpu_blocks()
    manager.allocate(g2)
    t1, t2 = manager.get_block_table(s1), manager.get_block_table(s2)
    assert t1[:3] == t2[:3] and t1[3] != t2[3]
    assert free_before - manager.get_num_free_gpu_blocks() == 1  # only the partial last block is new
    assert manager.get_common_computed_block_ids([s2]) == t1[:3]
    other, g3 = _group(3, [7] + prompt[1:])
    manager.allocate(g3)
    assert not set(manager.get_block_table(other)) & set(t1)


def test_hit_rate_zero_half_then_near_one():
    manager = BlockSpaceManager(4, 64, 0, watermark=0, enable_caching=True)
    prompt = list(range(16))
    assert manager.get_prefix_cache_hit_rate() == 0.0
    s, g = _group(0, prompt)
    manager.allocate(g)
    manager.mark_blocks_as_computed(g)
    manager.free(s)
    assert manager.get_prefix_cache_hit_rate() == 0.0
    s, g = _group(1, prompt)
    manager.allocate(g)
    assert manager.get_prefix_cache_hit_rate() == 0.5
    manager.free(s)
    for i in range(2, 1000):
        s, g = _group(i, prompt)
        manager.allocate(g)
        manager.free(s)
    assert manager.get_prefix_cache_hit_rate() > 0.99
    assert BlockSpaceManager(4, 4, 0).get_prefix_cache_hit_rate() == -1.0  # caching off: vLLM's -1


def test_freed_cached_blocks_stay_reusable_and_evict_lru():
    manager = BlockSpaceManager(4, 6, 0, watermark=0, enable_caching=True)
    a, ga = _group(1, list(range(8)))  # 2 full blocks
    b, gb = _group(2, list(range(100, 108)))
    manager.allocate(ga)
    manager.allocate(gb)
    manager.mark_blocks_as_computed(ga)
    manager.mark_blocks_as_computed(gb)
    a_blocks, b_blocks = manager.get_block_table(a), manager.get_block_table(b)
    manager.free(a)  # released first: least recently used
    manager.free(b)
    assert manager.get_num_free_gpu_blocks() == 6  # cached blocks count as free
    evictor = manager.gpu_allocator.evictor
    assert [blk.block_number for blk in evictor.blocks()] == a_blocks[::-1] + b_blocks[::-1]  # chain tails first
    c, gc = _group(3, list(range(200, 212)))  # 3 new blocks: 2 from the free list, then evict a's tail block
    manager.allocate(gc)
    assert a_blocks[1] in manager.get_block_table(c)
    assert not set(b_blocks) & set(manager.get_block_table(c))
    b2, gb2 = _group(4, list(range(100, 108)))
    manager.allocate(gb2)
    assert manager.get_block_table(b2) == b_blocks  # b's blocks survived eviction: full hits


def test_uncomputed_blocks_are_not_kept():
    """A prompt freed before its prefill ran holds no KV: its blocks must not serve later hits."""
    manager = BlockSpaceManager(4, 8, 0, watermark=0, enable_caching=True)
    s, g = _group(1, list(range(8)))
    manager.allocate(g)
    manager.free(s)
    assert len(manager.gpu_allocator.evictor) == 0 and not manager.gpu_allocator.cached_blocks
    s, g = _group(2, list(range(8)))
    manager.allocate(g)
    assert manager.get_prefix_cache_hit_rate() == 0.0


def test_just_filled_block_merges_into_identical_cached_block():
    manager = BlockSpaceManager(4, 8, 0, watermark=0, enable_caching=True)
    first, g1 = _group(1, [1, 2, 3, 4, 5, 6, 7, 8])
    manager.allocate(g1)
    manager.mark_blocks_as_computed(g1)
    second, g2 = _group(2, [1, 2, 3, 4, 5, 6])  # same tokens, generated rather than prompted
    manager.allocate(g2)
    second.status = SequenceStatus.RUNNING
    for token in (7, 8, 9):
        second.append_token_id(token)
        manager.append_slots(second)
    # block 1 of `second` was filled with 5..8 and computed: it now is `first`'s cached block; its copy was freed
    assert manager.get_block_table(second)[:2] == manager.get_block_table(first)
    assert manager.get_num_free_gpu_blocks() == 8 - 3


def test_hash_collision_never_shares_wrong_tokens():
    manager = BlockSpaceManager(4, 8, 0, watermark=0, enable_caching=True, hash_fn=lambda prev, toks: 42)
    s1, g1 = _group(1, [1, 2, 3, 4])
    manager.allocate(g1)
    manager.mark_blocks_as_computed(g1)
    s2, g2 = _group(2, [5, 6, 7, 8])  # same (colliding) hash, different tokens
    manager.allocate(g2)
    assert manager.get_block_table(s1) != manager.get_block_table(s2)
    assert manager.get_prefix_cache_hit_rate() == 0.0
    s3, g3 = _group(3, [1, 2, 3, 4])
    manager.allocate(g3)
    assert manager.get_block_table(s3) == manager.get_block_table(s1)  # a true hit still works


def test_evictor_and_allocator_counts():
    allocator = PrefixCachingBlockAllocator(Device.GPU, 2, 3)
    blocks = [allocator.allocate_cached(hash_block_tokens(None, [i, i]), None, [i, i]) for i in range(3)]
    for block in blocks:
        block.computed = True
        allocator.free(block)
    assert allocator.get_num_free_blocks() == 3 and len(allocator.evictor) == 3
    fresh = allocator.allocate()  # evicts the oldest cached block
    assert fresh is blocks[0] and fresh.block_hash is None and len(allocator.cached_blocks) == 2
    assert isinstance(allocator.evictor, LRUEvictor)


def test_swapped_in_blocks_are_cached_again():
    manager = BlockSpaceManager(4, 3, 4, watermark=0, enable_caching=True)
    seq, group = _group(1, list(range(8)))
    manager.allocate(group)
    manager.mark_blocks_as_computed(group)
    seq.status = SequenceStatus.RUNNING
    manager.swap_out(group)
    assert len(manager.gpu_allocator.evictor) == 2  # still cached on the GPU after the swap out
    filler, gf = _group(2, list(range(50, 62)))  # needs all 3 GPU blocks: evicts both cached ones
    manager.allocate(gf)
    assert not set(manager.block_tables[seq.seq_id].block_hashes) & set(manager.gpu_allocator.cached_blocks)
    manager.free(filler)  # never computed: its blocks leave the cache too
    assert not manager.gpu_allocator.cached_blocks
    seq.status = SequenceStatus.SWAPPED
    manager.swap_in(group)
    again, ga = _group(3, list(range(8)))
    manager.allocate(ga)
    assert manager.get_block_table(again) == manager.get_block_table(seq)  # hits on the swapped-in blocks
    assert manager.get_common_computed_block_ids([again]) == manager.get_block_table(seq)[:1]


def test_lookahead_slots_are_not_hashed_before_their_tokens_exist():
    manager = BlockSpaceManager(4, 8, 0, watermark=0, enable_caching=True)
    seq, group = _group(1, [1, 2, 3])
    manager.allocate(group)
    seq.status = SequenceStatus.RUNNING
    seq.append_token_id(4)
    manager.append_slots(seq, num_lookahead_slots=5)  # reserves slots for 9 tokens: blocks 0-2
    assert len(manager.get_block_table(seq)) == 3
    seq.append_token_id(5)
    manager.append_slots(seq)
    # only block 0 (tokens 1-4, all written) is hashed; the reserved-but-empty block 1 is not
    assert manager.block_tables[seq.seq_id].block_hashes == _chain([1, 2, 3, 4])
    assert len(manager.gpu_allocator.cached_blocks) == 1
