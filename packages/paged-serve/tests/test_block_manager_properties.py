"""Hypothesis state machine: random allocate / append / fork / free / swap keep the block manager's invariants.

Besides the bookkeeping invariants (ref count == number of tables holding the block, free + used == total on both
pools, nothing free is referenced), a shadow KV cache records what each physical slot's KV was computed from: the
token *and every token before it* (attention makes a slot's KV a function of its whole prefix). The engine's side
is simulated (write new tokens, mark them computed, apply CoW and swap mappings), and every sequence must read back
exactly its own prefixes through its block table. A wrong share, a missing copy, a bad merge, or a cache hit on a
block computed after a different prefix breaks that.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from paged_serve.core import (
    AllocStatus,
    BlockSpaceManager,
    Device,
    NoFreeBlocksError,
    Sequence,
    SequenceGroup,
    hash_block_tokens,
)
from paged_serve.core import SequenceStatus as S

BLOCK_SIZE = 4
# shared prefixes: cache hits; the last two collide on block 0 under the weak hash (equal sums) and share block 1
PREFIXES = [
    [1, 2, 3, 4, 5, 6, 7, 8],
    [1, 2, 3, 4, 9, 9, 9, 9],
    [5, 5, 5, 5],
    [0, 1, 2, 3, 2, 2, 2, 2],
    [3, 2, 1, 0, 2, 2, 2, 2],
]


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(
        enable_caching=st.booleans(),
        colliding_hash=st.booleans(),
        num_gpu=st.integers(4, 12),
        num_cpu=st.integers(0, 8),
    )
    def setup(self, enable_caching, colliding_hash, num_gpu, num_cpu):
        # a deliberately weak hash (collides on equal token sums) proves the token-id check on every hit
        hash_fn = (lambda prev, tokens: sum(tokens)) if colliding_hash else hash_block_tokens
        self.manager = BlockSpaceManager(
            BLOCK_SIZE, num_gpu, num_cpu, watermark=0.0, enable_caching=enable_caching, hash_fn=hash_fn
        )
        self.groups: dict[str, SequenceGroup] = {}
        self.shadow: dict[tuple[Device, int], list] = {}
        self.next_id = 0

    # ---------------------------------------------------------- engine side
    def _slot(self, block):
        return self.shadow.setdefault((block.device, block.block_number), [None] * BLOCK_SIZE)

    def _write(self, seq, positions):
        table, tokens = self.manager.block_tables[seq.seq_id], seq.get_token_ids()
        for pos in positions:
            self._slot(table[pos // BLOCK_SIZE])[pos % BLOCK_SIZE] = tuple(tokens[: pos + 1])

    def _copy(self, mapping, src_dev, dst_dev):
        for src, dst in mapping:
            self.shadow[(dst_dev, dst)] = list(self.shadow.get((src_dev, src), [None] * BLOCK_SIZE))

    def _seqs(self, status):
        return [s for g in self.groups.values() for s in g.get_seqs(status)]

    # ---------------------------------------------------------------- rules
    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=6), n=st.integers(1, 2))
    def allocate(self, prefix, tail, n):
        rid = str(self.next_id)
        seqs = [Sequence(self.next_id * 10 + i, prefix + tail, BLOCK_SIZE) for i in range(n)]
        self.next_id += 1
        group = SequenceGroup(rid, seqs)
        status = self.manager.can_allocate(group)
        if status != AllocStatus.OK:
            return
        self.manager.allocate(group)
        self.groups[rid] = group
        for seq in seqs:
            self._write(seq, range(seq.get_len()))  # prefill
            seq.status = S.RUNNING
        self.manager.mark_blocks_as_computed(group)

    @precondition(lambda self: self._seqs(S.RUNNING))
    @rule(data=st.data(), token=st.integers(0, 3), lookahead=st.sampled_from([0, 0, 3]))
    def append(self, data, token, lookahead):
        seq = data.draw(st.sampled_from(self._seqs(S.RUNNING)))
        seq.append_token_id(token)
        before = (self.manager.get_block_table(seq), self.manager.get_num_free_gpu_blocks())
        try:
            cows = self.manager.append_slots(seq, num_lookahead_slots=lookahead)
        except NoFreeBlocksError:
            assert self.manager.get_num_free_gpu_blocks() <= before[1]
            seq.output_token_ids.pop()  # the scheduler would preempt; here the token is dropped
            return
        assert all(src != dst for src, dst in cows) and len({dst for _, dst in cows}) == len(cows)
        assert not {src for src, _ in cows} & {dst for _, dst in cows}  # a source is never also a destination
        if lookahead == 0:
            assert len(cows) <= 1
        self._copy(cows, Device.GPU, Device.GPU)
        self._write(seq, [seq.get_len() - 1])  # the forward pass
        group = next(g for g in self.groups.values() if seq.seq_id in g.seqs_dict)
        for other in group.get_seqs(S.RUNNING):  # siblings reserved this step too; only `seq` was written
            if other is not seq and self.manager.block_tables[other.seq_id].num_scheduled_tokens != other.get_len():
                return
        self.manager.mark_blocks_as_computed(group)

    @precondition(lambda self: self._seqs(S.RUNNING))
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self._seqs(S.RUNNING)))
        group = next(g for g in self.groups.values() if parent.seq_id in g.seqs_dict)
        child = parent.fork(self.next_id * 10)
        self.next_id += 1
        self.manager.fork(parent, child)
        group.add(child)

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.groups)))
        group = self.groups[rid]
        seq = data.draw(st.sampled_from(group.get_seqs()))
        self.manager.free(seq)
        group.remove(seq.seq_id)
        if not group.get_seqs():
            del self.groups[rid]

    @precondition(lambda self: any(g.get_seqs() == g.get_seqs(S.RUNNING) for g in self.groups.values()))
    @rule(data=st.data())
    def swap_out(self, data):
        rid = data.draw(
            st.sampled_from(sorted(r for r, g in self.groups.items() if g.get_seqs() == g.get_seqs(S.RUNNING)))
        )
        group = self.groups[rid]
        if not self.manager.can_swap_out(group):
            return
        self._copy(self.manager.swap_out(group), Device.GPU, Device.CPU)
        for seq in group.get_seqs():
            seq.status = S.SWAPPED

    @precondition(lambda self: any(g.get_seqs(S.SWAPPED) for g in self.groups.values()))
    @rule(data=st.data())
    def swap_in(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, g in self.groups.items() if g.get_seqs(S.SWAPPED))))
        group = self.groups[rid]
        if self.manager.can_swap_in(group) != AllocStatus.OK:
            return
        self._copy(self.manager.swap_in(group), Device.CPU, Device.GPU)
        for seq in group.get_seqs():
            seq.status = S.RUNNING

    # ----------------------------------------------------------- invariants
    @invariant()
    def ref_counts_match_tables_and_counts_conserve(self):
        refs = Counter()
        for table in self.manager.block_tables.values():
            assert len({id(b) for b in table}) == len(table)  # a table never lists a block twice
            assert len(table) == -(-table.num_tokens // BLOCK_SIZE)
            refs.update(id(b) for b in table)
        for allocator in (self.manager.gpu_allocator, self.manager.cpu_allocator):
            used = [b for b in allocator.blocks if b.ref_count > 0]
            for block in allocator.blocks:
                assert block.ref_count == refs[id(block)], block
            assert allocator.get_num_free_blocks() + len(used) == allocator.get_num_total_blocks()
            free_ids = [b.block_number for b in allocator.free_blocks]
            assert len(set(free_ids)) == len(free_ids) and all(allocator.blocks[i].ref_count == 0 for i in free_ids)
        if self.manager.enable_caching:
            gpu = self.manager.gpu_allocator
            for block_hash, block in gpu.cached_blocks.items():
                assert block.block_hash == block_hash
            for block in gpu.evictor.blocks():
                assert block.ref_count == 0 and gpu.cached_blocks[block.block_hash] is block

    @invariant()
    def every_sequence_reads_back_its_tokens(self):
        for group in self.groups.values():
            for seq in group.get_seqs():
                table = self.manager.block_tables[seq.seq_id]
                assert table.num_tokens >= seq.get_len() == table.num_scheduled_tokens
                empty = [None] * BLOCK_SIZE  # a block reserved ahead (lookahead) may not be written yet
                stored = [x for b in table for x in self.shadow.get((b.device, b.block_number), empty)]
                tokens = seq.get_token_ids()
                assert stored[: seq.get_len()] == [tuple(tokens[: i + 1]) for i in range(seq.get_len())]


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_block_manager_state_machine = BlockManagerMachine.TestCase
