"""Swapping (PagedAttention paper section 4.5): move a whole sequence group's blocks to the CPU pool and back.

Under memory pressure the scheduler may evict a group by copying its KV blocks to CPU instead of dropping them
(recompute). The block manager only remaps: ``swap_out``/``swap_in`` return ``(src, dst)`` block pairs that the
cache engine copies with ``swap_blocks``. Blocks shared inside the group (forks) stay shared on the other side.
"""

from __future__ import annotations

from paged_serve.core.alloc_status import AllocStatus
from paged_serve.core.block import PhysicalBlock
from paged_serve.core.block_allocator import BlockAllocator, NoFreeBlocksError
from paged_serve.core.sequence import SequenceGroup, SequenceStatus


class SwapMixin:
    """The swap half of ``BlockSpaceManager`` (which provides the pools, tables and growth accounting)."""

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return len(self._unique_blocks(seq_group, SequenceStatus.RUNNING)) <= self.cpu_allocator.get_num_free_blocks()

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's RUNNING sequences to CPU blocks; returns ``(gpu_block, cpu_block)`` pairs to copy."""
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """Whether the SWAPPED sequences fit back on the GPU together with the slots their next step needs.

        Counted exactly as ``append_slots`` will reserve them right after (vLLM's v2 manager counts the blocks an
        append touches): the group's distinct blocks, plus a new block only for a sequence whose unseen tokens
        cross into one, plus a copy of a shared block the next step writes into.
        """
        blocks = self._unique_blocks(seq_group, SequenceStatus.SWAPPED)
        seqs = seq_group.get_seqs(status=SequenceStatus.SWAPPED)
        num_required = len(blocks) + self._num_new_blocks(seqs, num_lookahead_slots)
        if self.num_total_gpu_blocks < num_required:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Bring the group's SWAPPED sequences back; returns ``(cpu_block, gpu_block)`` pairs to copy.

        A block keeps its ``computed`` flag across the round trip: one swapped out mid chunked prefill comes back
        uncomputed and is not offered to the prefix cache.
        """
        mapping = self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)
        if self.enable_caching:  # swapped-in computed blocks hold known content again: make them findable
            for seq in seq_group.get_seqs(status=SequenceStatus.SWAPPED):
                table, token_ids = self._table(seq), seq.get_token_ids()
                for i in range(min(table.num_promoted, len(table.block_hashes))):
                    if not table[i].computed:
                        break
                    parent = table[i - 1] if i else None
                    self.gpu_allocator.register(
                        table[i], table.block_hashes[i], self._block_tokens(token_ids, i), parent
                    )
        return mapping

    def _swap(
        self, seq_group: SequenceGroup, status: SequenceStatus, src: BlockAllocator, dst: BlockAllocator
    ) -> list[tuple[int, int]]:
        seqs = seq_group.get_seqs(status=status)
        blocks = self._unique_blocks(seq_group, status)
        for block in blocks:
            if block.device != src.device:
                raise ValueError(f"cannot swap {block} out of {src.device.name}: it is on {block.device.name}")
        if len(blocks) > dst.get_num_free_blocks():
            raise NoFreeBlocksError(
                f"swap of {len(blocks)} blocks to {dst.device.name}: only {dst.get_num_free_blocks()} free"
            )
        moved: dict[int, PhysicalBlock] = {}
        for seq in seqs:
            table = self._table(seq)
            for i, block in enumerate(table.blocks):
                if id(block) in moved:
                    new = moved[id(block)]
                    dst.incr_ref(new)
                else:
                    new = moved[id(block)] = dst.allocate()
                    new.computed = block.computed
                table[i] = new
                src.free(block)
        return [(b.block_number, moved[id(b)].block_number) for b in blocks]
