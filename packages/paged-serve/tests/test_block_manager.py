"""BlockSpaceManager behaviours as vLLM's tests/core/test_block_manager.py asserts them, plus misuse errors."""

from __future__ import annotations

from collections import defaultdict

import pytest
from paged_serve.core import (
    AllocStatus,
    BlockSpaceManager,
    NoFreeBlocksError,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    UnknownSequenceError,
)


def create_dummy_prompt(request_id: str, prompt_length: int, block_size: int = 4, num_seqs: int = 1):
    seqs = [Sequence(int(request_id) * 10 + i, range(prompt_length), block_size) for i in range(num_seqs)]
    return seqs[0], SequenceGroup(request_id, seqs)


def _manager(num_gpu=4, num_cpu=4, watermark=0.0, **kw):
    return BlockSpaceManager(4, num_gpu, num_cpu, watermark=watermark, **kw)


def test_allocate():
    manager = _manager()
    for i in range(4):
        _, group = create_dummy_prompt(str(i), 4)
        assert manager.can_allocate(group) == AllocStatus.OK
        manager.allocate(group)
    assert manager.can_allocate(group) == AllocStatus.LATER
    # watermark of one block: only three fit
    manager = _manager(watermark=1 / 4)
    for i in range(3):
        _, group = create_dummy_prompt(str(i), 4)
        assert manager.can_allocate(group) == AllocStatus.OK
        manager.allocate(group)
    assert manager.can_allocate(group) == AllocStatus.LATER


def test_can_allocate_never_when_prompt_exceeds_cache_minus_watermark():
    _, group = create_dummy_prompt("1", 16)  # 4 blocks
    assert _manager().can_allocate(group) == AllocStatus.OK
    assert _manager(watermark=0.25).can_allocate(group) == AllocStatus.NEVER
    _, big = create_dummy_prompt("2", 17)
    assert _manager().can_allocate(big) == AllocStatus.NEVER
    with pytest.raises(NoFreeBlocksError, match="needs 5 new blocks"):
        _manager().allocate(big)


def test_allocate_free_restores_free_count():
    manager = _manager(num_gpu=8)
    seqs = []
    for i in range(3):
        seq, group = create_dummy_prompt(str(i), 5, num_seqs=2)  # two sequences share the prompt blocks
        manager.allocate(group)
        seqs += group.get_seqs()
    assert manager.get_num_free_gpu_blocks() == 8 - 6
    for seq in seqs:
        manager.free(seq)
    assert manager.get_num_free_gpu_blocks() == 8


def test_append_slot_single_seq():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 4)
    manager.allocate(group)
    prompt.status = SequenceStatus.RUNNING
    assert manager.can_append_slots(group)
    before = manager.get_num_free_gpu_blocks()
    assert manager.append_slots(prompt) == []  # nothing new to hold
    assert manager.get_num_free_gpu_blocks() == before
    for token in range(5, 9):
        prompt.append_token_id(token)
        assert manager.can_append_slot(group)
        assert manager.append_slot(prompt) is None
        # a new block is taken exactly when the first token past the full block arrives
        assert before - manager.get_num_free_gpu_blocks() == 1
    prompt.append_token_id(9)
    manager.append_slots(prompt)
    assert before - manager.get_num_free_gpu_blocks() == 2


def test_append_slot_cow():
    manager = _manager()
    prompt = Sequence(1, [1, 2, 3], 4)  # one free slot in the block
    child = prompt.fork(2)
    group = SequenceGroup("1", [prompt, child])
    manager.allocate(group)
    child.append_token_id(4)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
    assert manager.can_append_slots(group)
    before = manager.get_num_free_gpu_blocks()
    cows = manager.append_slots(child)
    assert len(cows) == 1
    by_src = defaultdict(list)
    for src, dst in cows:
        by_src[src].append(dst)
    for src, dsts in by_src.items():
        assert src not in dsts
    assert before - manager.get_num_free_gpu_blocks() == 1
    assert manager.get_block_table(child) == [cows[0][1]] and manager.get_block_table(prompt) == [cows[0][0]]
    prompt.append_token_id(9)  # the parent now owns its block alone: no second copy
    assert manager.append_slot(prompt) is None


def test_fork():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 3)
    manager.allocate(group)
    child = prompt.fork(2)
    manager.fork(prompt, child)
    assert manager.get_block_table(prompt) == manager.get_block_table(child)
    assert manager.gpu_allocator.blocks[manager.get_block_table(prompt)[0]].ref_count == 2
    child.append_token_id(4)
    manager.append_slots(child)
    assert manager.get_block_table(prompt) != manager.get_block_table(child)


def test_full_shared_last_block_needs_no_copy():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 4)
    manager.allocate(group)
    child = prompt.fork(2)
    manager.fork(prompt, child)
    child.append_token_id(4)
    assert manager.append_slots(child) == []  # the new token lands in a fresh block, the full one stays shared
    assert manager.get_block_table(child)[0] == manager.get_block_table(prompt)[0]


def test_swap():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 3)
    manager.allocate(group)
    prompt.status = SequenceStatus.RUNNING
    prompt.append_token_id(0)
    manager.append_slots(prompt)
    gpu_blocks = manager.get_block_table(prompt)
    assert manager.can_swap_out(group)
    before_cpu, before_gpu = manager.get_num_free_cpu_blocks(), manager.get_num_free_gpu_blocks()
    mapping = manager.swap_out(group)
    assert [g for g, _ in mapping] == gpu_blocks
    assert before_cpu == manager.get_num_free_cpu_blocks() + len(gpu_blocks)
    assert before_gpu + len(gpu_blocks) == manager.get_num_free_gpu_blocks()
    prompt.status = SequenceStatus.SWAPPED
    cpu_blocks = manager.get_block_table(prompt)
    assert cpu_blocks == [c for _, c in mapping]
    assert manager.can_swap_in(group) == AllocStatus.OK
    before_cpu, before_gpu = manager.get_num_free_cpu_blocks(), manager.get_num_free_gpu_blocks()
    mapping = manager.swap_in(group)
    assert [c for c, _ in mapping] == cpu_blocks
    assert before_cpu + len(cpu_blocks) == manager.get_num_free_cpu_blocks()
    assert before_gpu == manager.get_num_free_gpu_blocks() + len(cpu_blocks)
    assert manager.get_num_free_cpu_blocks() == 4 and manager.get_num_free_gpu_blocks() == 3
    assert manager.get_block_table(prompt) == [g for _, g in mapping]  # the table is back on GPU blocks
    assert manager.block_tables[prompt.seq_id].num_tokens == prompt.get_len()


def test_swap_forked_group_shares_cpu_blocks():
    manager = _manager(num_gpu=8, num_cpu=8)
    prompt, group = create_dummy_prompt("1", 6, num_seqs=2)
    manager.allocate(group)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
    mapping = manager.swap_out(group)
    assert len(mapping) == 2 and manager.get_num_free_cpu_blocks() == 6 and manager.get_num_free_gpu_blocks() == 8
    a, b = group.get_seqs()
    assert manager.get_block_table(a) == manager.get_block_table(b)
    small = _manager(num_gpu=8, num_cpu=1)
    running = _allocated_running(small)
    assert not small.can_swap_out(running)
    with pytest.raises(NoFreeBlocksError):
        small.swap_out(running)
    assert small.get_num_free_gpu_blocks() == 6 and small.get_num_free_cpu_blocks() == 1  # nothing moved
    for seq in group.get_seqs():
        seq.status = SequenceStatus.SWAPPED
    assert manager.can_swap_in(group) == AllocStatus.OK  # 2 blocks + one new block per sequence <= 8
    assert manager.can_swap_in(group, num_lookahead_slots=16) == AllocStatus.NEVER  # 2 + 2 * (1 + 4) > 8
    manager.swap_in(group)
    assert manager.get_block_table(a) == manager.get_block_table(b) and manager.get_num_free_cpu_blocks() == 8


def _allocated_running(manager):
    _, group = create_dummy_prompt("5", 8)
    manager.allocate(group)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
    return group


def test_free():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 4)
    manager.allocate(group)
    num_blocks = len(manager.get_block_table(prompt))
    before = manager.get_num_free_gpu_blocks()
    manager.free(prompt)
    assert manager.get_num_free_gpu_blocks() == before + num_blocks
    with pytest.raises(KeyError):
        manager.get_block_table(prompt)
    manager.free(prompt)  # already freed: a no-op, as vLLM's (abort and finish may both free)
    never, _ = create_dummy_prompt("2", 4)
    manager.free(never)  # never allocated (aborted while WAITING): a no-op too
    assert manager.get_num_free_gpu_blocks() == before + num_blocks


def test_reset():
    manager = _manager()
    for i in range(4):
        _, group = create_dummy_prompt(str(i), 4)
        manager.allocate(group)
    assert manager.get_num_free_gpu_blocks() == 0
    manager.reset()
    assert manager.get_num_free_gpu_blocks() == 4 and not manager.block_tables


def test_append_past_capacity_raises_without_corruption():
    manager = _manager(num_gpu=1)
    prompt, group = create_dummy_prompt("1", 4)
    manager.allocate(group)
    prompt.status = SequenceStatus.RUNNING
    prompt.append_token_id(1)
    assert not manager.can_append_slots(group)
    with pytest.raises(NoFreeBlocksError):
        manager.append_slots(prompt)
    assert manager.get_block_table(prompt) == [0] and manager.get_num_free_gpu_blocks() == 0


def test_misuse_errors():
    manager = _manager()
    prompt, group = create_dummy_prompt("1", 4)
    with pytest.raises(UnknownSequenceError):
        manager.append_slots(prompt)
    with pytest.raises(UnknownSequenceError):
        manager.fork(prompt, prompt.fork(2))
    manager.allocate(group)
    with pytest.raises(ValueError, match="already has blocks"):
        manager.fork(prompt, prompt)
    with pytest.raises(ValueError, match="WAITING"):
        manager.allocate(SequenceGroup("x", [_running(8)]))
    with pytest.raises(ValueError, match="watermark"):
        BlockSpaceManager(4, 4, 4, watermark=1.5)


def _running(seq_id):
    seq = Sequence(seq_id, [1, 2], 4)
    seq.status = SequenceStatus.RUNNING
    return seq


def test_kv_utilization_counts_filled_slots_once():
    manager = _manager(num_gpu=8)
    assert manager.get_kv_utilization() == 0.0
    prompt, group = create_dummy_prompt("1", 6, num_seqs=2)  # 6 tokens in 2 shared blocks of 4
    manager.allocate(group)
    assert manager.get_kv_utilization() == 6 / 8
    prompt.append_token_id(1)
    prompt.append_token_id(2)
    prompt.status = SequenceStatus.RUNNING
    manager.append_slots(prompt)  # CoW of the shared last block: 3 blocks hold 4 + 2 + 4 tokens
    assert manager.get_kv_utilization() == 10 / 12


def test_cow_of_a_shared_lookahead_block():
    """Slots reserved ahead (speculative decoding) and then shared by a fork are copied before either writes."""
    manager = _manager(num_gpu=8)
    prompt, group = create_dummy_prompt("1", 3)
    manager.allocate(group)
    prompt.status = SequenceStatus.RUNNING
    prompt.append_token_id(4)
    assert manager.append_slots(prompt, num_lookahead_slots=3) == []  # 7 slots: block 1 reserved, empty
    child = prompt.fork(2)
    manager.fork(prompt, child)
    child.append_token_id(5)
    cows = manager.append_slots(child)
    assert len(cows) == 1 and cows[0][0] == manager.get_block_table(prompt)[1]
    assert manager.get_block_table(child)[0] == manager.get_block_table(prompt)[0]  # the written block stays shared
    assert manager.get_block_table(child)[1] == cows[0][1]


def test_can_swap_in_counts_only_the_blocks_the_next_step_touches():
    """A 6-token sequence (block size 8) fits a 1-block GPU pool again: its next token lands in the same block."""
    manager = BlockSpaceManager(8, 1, 1, watermark=0.0)
    seq = Sequence(1, range(5), 8)
    group = SequenceGroup("1", [seq])
    manager.allocate(group)
    seq.status = SequenceStatus.RUNNING
    seq.append_token_id(5)  # 6 tokens: slots reserved by the step that wrote token 5
    manager.append_slots(seq)
    seq.append_token_id(6)  # the step after: preempted by swap before its slots were reserved
    manager.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    assert manager.can_swap_in(group) == AllocStatus.OK
    manager.swap_in(group)
    seq.status = SequenceStatus.RUNNING
    assert manager.append_slots(seq) == [] and manager.get_num_free_gpu_blocks() == 0
    # a sequence whose unseen token opens a second block can never come back to a 1-block pool
    full = Sequence(2, range(8), 8)
    g2 = SequenceGroup("2", [full])
    other = BlockSpaceManager(8, 1, 1, watermark=0.0)
    other.allocate(g2)
    full.status = SequenceStatus.RUNNING
    full.append_token_id(8)
    other.swap_out(g2)
    full.status = SequenceStatus.SWAPPED
    assert other.can_swap_in(g2) == AllocStatus.NEVER
    # and a forked pair sharing a partial block needs one copy for the sibling that writes into it
    pair = BlockSpaceManager(4, 3, 4, watermark=0.0)
    a = Sequence(3, range(6), 4)
    g3 = SequenceGroup("3", [a])
    pair.allocate(g3)
    a.status = SequenceStatus.RUNNING
    b = a.fork(4)
    pair.fork(a, b)
    g3.add(b)
    for s in (a, b):
        s.append_token_id(9)
    pair.swap_out(g3)
    for s in (a, b):
        s.status = SequenceStatus.SWAPPED
    assert pair.can_swap_in(g3) == AllocStatus.OK  # 2 shared blocks + 1 copy of the partial block = 3
    pair.allocate(SequenceGroup("5", [Sequence(5, range(2), 4)]))
    assert pair.can_swap_in(g3) == AllocStatus.LATER


def test_allocate_sizes_each_diverged_sequence_of_a_recomputed_fork():
    """Recompute of a forked group whose sequences diverged: each gets blocks for its own tokens."""
    manager = _manager(num_gpu=8)
    parent = Sequence(1, [1, 2, 3, 4, 5], 4)
    child = parent.fork(2)
    parent.output_token_ids = [6, 7, 8, 9]  # 9 tokens: 3 blocks
    child.output_token_ids = [0]  # 6 tokens: 2 blocks, block 0 equal to the parent's
    group = SequenceGroup("1", [parent, child])
    assert manager.can_allocate(group) == AllocStatus.OK
    manager.allocate(group)
    a, b = manager.get_block_table(parent), manager.get_block_table(child)
    assert len(a) == 3 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]  # the common full block 0 is shared, the rest is private
    assert manager.get_num_free_gpu_blocks() == 8 - 4
    assert manager.block_tables[parent.seq_id].num_tokens == 9 and manager.block_tables[child.seq_id].num_tokens == 6
    tight = _manager(num_gpu=3)
    parent2, child2 = Sequence(3, range(9), 4), Sequence(4, [9] * 6, 4)
    assert tight.can_allocate(SequenceGroup("2", [parent2, child2])) == AllocStatus.NEVER  # 3 + 2 blocks > 3
