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
    for token in (7, 8, 9):  # decode steps: reserve, forward (writes KV), mark computed
        second.append_token_id(token)
        manager.append_slots(second)
        manager.mark_blocks_as_computed(g2)
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
    blocks = [allocator.allocate_cached(hash_block_tokens(None, [i, i]), [i, i]) for i in range(3)]
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
    manager.mark_blocks_as_computed(group)
    seq.append_token_id(5)
    manager.append_slots(seq)
    manager.mark_blocks_as_computed(group)
    # only block 0 (tokens 1-4, all written) is hashed; the reserved-but-empty block 1 is not
    assert manager.block_tables[seq.seq_id].block_hashes == _chain([1, 2, 3, 4])
    assert len(manager.gpu_allocator.cached_blocks) == 1


def _collides_on_block_0(prev, tokens):
    """Every first block hashes alike; later blocks chain normally (a collision at the head of a chain)."""
    return 7 if prev is None else hash_block_tokens(prev, tokens)


def test_a_collision_on_block_0_never_shares_block_1_of_another_prefix():
    manager = BlockSpaceManager(4, 16, 0, watermark=0, enable_caching=True, hash_fn=_collides_on_block_0)
    a, ga = _group(1, [1, 2, 3, 4, 9, 9, 9, 9, 0])
    manager.allocate(ga)
    manager.mark_blocks_as_computed(ga)
    # same hash chain (block 0 collides, block 1 equal tokens) but a different prefix: block 1's KV differs
    b, gb = _group(2, [5, 6, 7, 8, 9, 9, 9, 9, 0])
    assert manager.get_num_cached_tokens(gb) == 0
    manager.allocate(gb)
    assert not set(manager.get_block_table(a)) & set(manager.get_block_table(b))
    assert manager.get_common_computed_block_ids([b]) == []
    # and a block filled by decoding after the colliding prefix is not merged into a's block 1 either
    c, gc = _group(3, [5, 6, 7, 8, 9, 9, 9])
    manager.allocate(gc)
    manager.mark_blocks_as_computed(gc)
    c.status = SequenceStatus.RUNNING
    c.append_token_id(9)
    manager.append_slots(c)
    manager.mark_blocks_as_computed(gc)
    assert manager.get_block_table(c)[1] != manager.get_block_table(a)[1]


def test_a_cached_block_whose_predecessor_was_reused_is_never_hit():
    """x's block 1 was cached after x's private block 0; that block is freed and handed to y's (colliding) block 0:
    the same physical predecessor, other content, so x's block 1 must not serve y."""
    manager = BlockSpaceManager(4, 4, 0, watermark=0, enable_caching=True, hash_fn=_collides_on_block_0)
    a, ga = _group(1, [1, 2, 3, 4, 0])  # holds the (colliding) block-0 hash and one more block
    manager.allocate(ga)
    manager.mark_blocks_as_computed(ga)
    x, gx = _group(2, [6, 5, 7, 8, 9, 9, 9, 9])  # block 0 misses (other tokens): private; block 1 is cached
    manager.allocate(gx)
    manager.mark_blocks_as_computed(gx)
    x_blocks = manager.get_block_table(x)
    manager.free(x)  # block 1 stays cached (evictable), block 0 goes back to the free list
    y, gy = _group(3, [5, 6, 7, 8, 9, 9, 9, 9])
    assert manager.get_num_cached_tokens(gy) == 0
    manager.allocate(gy)
    table = manager.block_tables[y.seq_id]
    assert table[0].block_number == x_blocks[0]  # y's block 0 is x's old block 0...
    assert not table[1].computed  # ...but x's block 1 was not handed out as computed KV
    assert manager.get_common_computed_block_ids([y]) == []


def test_swap_in_keeps_uncomputed_blocks_uncomputed():
    """Swapped out in the middle of a chunked prefill: only the chunk that ran holds KV after swap in."""
    manager = BlockSpaceManager(4, 8, 4, watermark=0, enable_caching=True)
    seq, group = _group(1, list(range(8)))
    manager.allocate(group)
    manager.mark_blocks_as_computed(group, num_computed_tokens=4)  # first chunk of 4 tokens ran
    seq.status = SequenceStatus.RUNNING
    manager.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    manager.swap_in(group)
    table = manager.block_tables[seq.seq_id]
    assert table[0].computed and not table[1].computed
    again, ga = _group(2, list(range(8)) + [99, 98])
    manager.allocate(ga)
    computed = manager.get_common_computed_block_ids([again])
    assert len(computed) == 1  # block 0 (the GPU copy still cached, or the swapped-in one); never block 1
    assert computed == manager.get_block_table(again)[:1]


def test_reserving_twice_before_a_forward_pass_caches_nothing_unwritten():
    """Two append_slots for one sequence without a forward in between: block 0's last slot has no KV yet."""
    manager = BlockSpaceManager(4, 8, 0, watermark=0, enable_caching=True)
    seq, group = _group(1, [1, 2, 3])
    manager.allocate(group)
    manager.mark_blocks_as_computed(group)
    seq.status = SequenceStatus.RUNNING
    seq.append_token_id(4)
    manager.append_slots(seq)  # slot 3 reserved for token 4; the forward pass that writes it has not run
    seq.append_token_id(5)
    manager.append_slots(seq)
    assert not manager.block_tables[seq.seq_id][0].computed and not manager.gpu_allocator.cached_blocks
    probe, gp = _group(2, [1, 2, 3, 4, 7])
    assert manager.get_num_cached_tokens(gp) == 0
    manager.allocate(gp)
    assert manager.get_common_computed_block_ids([probe]) == []
    manager.mark_blocks_as_computed(group)  # the forward ran: tokens 1-4 (and 5) have KV now
    assert manager.block_tables[seq.seq_id][0].computed


def test_get_num_cached_tokens_counts_computed_prompt_blocks():
    manager = BlockSpaceManager(4, 16, 0, watermark=0, enable_caching=True)
    s1, g1 = _group(1, list(range(10)))
    manager.allocate(g1)
    _, g2 = _group(2, list(range(12)))
    assert manager.get_num_cached_tokens(g2) == 0  # registered, not computed yet
    manager.mark_blocks_as_computed(g1)
    assert manager.get_num_cached_tokens(g2) == 8
    _, g3 = _group(3, list(range(8)))  # fully cached: the last block is computed again for its logits
    assert manager.get_num_cached_tokens(g3) == 4
    assert BlockSpaceManager(4, 16, 0).get_num_cached_tokens(g2) == 0
