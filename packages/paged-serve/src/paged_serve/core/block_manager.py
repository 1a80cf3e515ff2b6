"""``BlockSpaceManager``: maps every sequence's logical KV blocks to physical blocks (vLLM ``block_manager_v1``).

The scheduler asks it whether a request fits (``can_allocate`` -> OK / LATER / NEVER), reserves slots as
sequences grow (``append_slots``, returning copy-on-write pairs for ``copy_blocks``), shares blocks between forked
sequences (PagedAttention paper section 4.4), and moves whole sequence groups to CPU and back under memory
pressure (``swap_out``/``swap_in`` return the block mappings for ``swap_blocks``, section 4.5). A watermark of
GPU blocks is kept free at admission so running sequences can still grow without immediate preemption.

Contract with the engine: ``append_slots`` is called once per step for each running sequence after its newest
token was appended; every slot reserved by earlier calls has had its KV written by then. Prefix caching relies on
it: blocks filled before the call are hashed and merged into identical cached blocks.
"""

from __future__ import annotations

import enum

from paged_serve.core.block import BlockTable, Device, PhysicalBlock
from paged_serve.core.block_allocator import BlockAllocator, NoFreeBlocksError
from paged_serve.core.prefix_caching import HashFn, PrefixCachingBlockAllocator, hash_block_tokens
from paged_serve.core.sequence import Sequence, SequenceGroup, SequenceStatus


class AllocStatus(enum.Enum):
    """OK: allocate now. LATER: not enough free blocks now. NEVER: the prompt can never fit this cache."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class UnknownSequenceError(KeyError):
    """The sequence has no block table: never allocated, or already freed."""


class BlockSpaceManager:
    """Logical -> physical KV block mapping for all sequences, over a GPU and a CPU block pool."""

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        enable_caching: bool = False,
        hash_fn: HashFn = hash_block_tokens,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_gpu_blocks < 0 or num_cpu_blocks < 0:
            raise ValueError(f"block counts must be >= 0, got gpu={num_gpu_blocks} cpu={num_cpu_blocks}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_caching = enable_caching
        self.hash_fn = hash_fn
        gpu_cls = PrefixCachingBlockAllocator if enable_caching else BlockAllocator
        self.gpu_allocator = gpu_cls(Device.GPU, block_size, num_gpu_blocks)
        self.cpu_allocator = BlockAllocator(Device.CPU, block_size, num_cpu_blocks)
        self.block_tables: dict[int, BlockTable] = {}

    # ----------------------------------------------------------------- helpers
    def _allocator(self, device: Device) -> BlockAllocator:
        return self.gpu_allocator if device == Device.GPU else self.cpu_allocator

    def _table(self, seq: Sequence) -> BlockTable:
        try:
            return self.block_tables[seq.seq_id]
        except KeyError:
            msg = f"sequence {seq.seq_id} has no blocks (never allocated, or already freed)"
            raise UnknownSequenceError(msg) from None

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _block_tokens(self, token_ids: list[int], index: int) -> list[int]:
        return token_ids[index * self.block_size : (index + 1) * self.block_size]

    def _chain(self, token_ids: list[int], num_full_blocks: int, hashes: list[int]) -> list[int]:
        """Extend ``hashes`` (chain hashes of leading full blocks) to ``num_full_blocks`` entries."""
        hashes = list(hashes)
        for i in range(len(hashes), num_full_blocks):
            hashes.append(self.hash_fn(hashes[-1] if hashes else None, self._block_tokens(token_ids, i)))
        return hashes

    def _unique_blocks(self, seq_group: SequenceGroup, status: SequenceStatus) -> list[PhysicalBlock]:
        seen: dict[int, PhysicalBlock] = {}
        for seq in seq_group.get_seqs(status=status):
            for block in self._table(seq):
                seen.setdefault(id(block), block)
        return list(seen.values())

    # -------------------------------------------------------------- admission
    def _num_required_blocks(self, token_ids: list[int]) -> tuple[int, list[int]]:
        """Free blocks a prompt takes (cached blocks other sequences hold are shared for free), and its hashes."""
        num_blocks = self._num_blocks(len(token_ids))
        if not self.enable_caching:
            return num_blocks, []
        hashes = self._chain(token_ids, len(token_ids) // self.block_size, [])
        for i, block_hash in enumerate(hashes):
            prev = hashes[i - 1] if i else None
            num_blocks -= self.gpu_allocator.is_in_use(block_hash, prev, self._block_tokens(token_ids, i))
        return num_blocks, hashes

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Whether the group's prompt fits: blocks beyond the watermark free now (OK), later, or never."""
        seqs = seq_group.get_seqs(status=SequenceStatus.WAITING) or seq_group.get_seqs()
        token_ids = seqs[0].get_token_ids()
        if self.num_total_gpu_blocks - self._num_blocks(len(token_ids)) < self.watermark_blocks:
            return AllocStatus.NEVER
        num_required, _ = self._num_required_blocks(token_ids)
        if self.gpu_allocator.get_num_free_blocks() - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Reserve blocks for the prompt, shared by all WAITING sequences of the group (ref count per sequence)."""
        seqs = seq_group.get_seqs(status=SequenceStatus.WAITING)
        if not seqs:
            raise ValueError(f"{seq_group} has no WAITING sequence to allocate")
        for seq in seqs:
            if seq.seq_id in self.block_tables:
                raise ValueError(f"sequence {seq.seq_id} already has blocks")
        token_ids = seqs[0].get_token_ids()
        if not token_ids:
            raise ValueError(f"sequence {seqs[0].seq_id} has no tokens to allocate")
        num_required, hashes = self._num_required_blocks(token_ids)
        if num_required > self.gpu_allocator.get_num_free_blocks():
            raise NoFreeBlocksError(
                f"prompt of {len(token_ids)} tokens needs {num_required} new blocks, "
                f"{self.gpu_allocator.get_num_free_blocks()} free"
            )
        num_blocks = self._num_blocks(len(token_ids))
        table = BlockTable(num_tokens=len(token_ids), block_hashes=hashes)
        if self.enable_caching:
            for i, block_hash in enumerate(table.block_hashes):
                prev = table.block_hashes[i - 1] if i else None
                table.append(self.gpu_allocator.allocate_cached(block_hash, prev, self._block_tokens(token_ids, i)))
        while len(table) < num_blocks:
            table.append(self.gpu_allocator.allocate())
        self.block_tables[seqs[0].seq_id] = table
        for seq in seqs[1:]:
            for block in table:
                self.gpu_allocator.incr_ref(block)
            self.block_tables[seq.seq_id] = table.copy()

    # ----------------------------------------------------------------- growth
    def _shared_blocks_to_write(self, table: BlockTable, target: int) -> list[int]:
        """Indices of existing blocks the next step writes into (slots ``num_scheduled_tokens`` .. ``target``) that
        another sequence also holds: each needs a private copy first (copy-on-write)."""
        if target <= table.num_scheduled_tokens:
            return []
        first = table.num_scheduled_tokens // self.block_size
        end = min(len(table), self._num_blocks(target))
        return [i for i in range(first, end) if table[i].ref_count > 1]

    def _num_new_blocks(self, seq: Sequence, num_lookahead_slots: int) -> int:
        table = self._table(seq)
        target = seq.get_len() + num_lookahead_slots
        new = max(0, self._num_blocks(target) - len(table))
        return new + len(self._shared_blocks_to_write(table, target))

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """Whether every RUNNING sequence of the group can reserve slots for its new tokens right now."""
        needed = sum(self._num_new_blocks(s, num_lookahead_slots) for s in seq_group.get_seqs(SequenceStatus.RUNNING))
        return needed <= self.gpu_allocator.get_num_free_blocks()

    def can_append_slot(self, seq_group: SequenceGroup) -> bool:
        return self.can_append_slots(seq_group, 0)

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Reserve slots up to ``seq.get_len() + num_lookahead_slots`` tokens.

        Returns the copy-on-write ``(src, dst)`` block pairs the engine must copy before writing: a shared block
        about to receive the new token (at most one without lookahead: the shared, partially filled last block).
        Raises ``NoFreeBlocksError`` without changing anything when the GPU pool cannot cover it.
        """
        table = self._table(seq)
        if self.enable_caching:
            self._promote_full_blocks(seq, table)
        needed = self._num_new_blocks(seq, num_lookahead_slots)
        free = self.gpu_allocator.get_num_free_blocks()
        if needed > free:
            raise NoFreeBlocksError(f"sequence {seq.seq_id} needs {needed} new blocks, {free} free")
        target = seq.get_len() + num_lookahead_slots
        cows: list[tuple[int, int]] = []
        for i in self._shared_blocks_to_write(table, target):
            shared, fresh = table[i], self.gpu_allocator.allocate()
            self.gpu_allocator.free(shared)
            table[i] = fresh
            cows.append((shared.block_number, fresh.block_number))
        while len(table) * self.block_size < target:
            table.append(self.gpu_allocator.allocate())
        table.num_tokens = max(table.num_tokens, target)
        table.num_scheduled_tokens = max(table.num_scheduled_tokens, seq.get_len())
        return cows

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """One new token: ``append_slots`` without lookahead; the CoW pair or ``None`` (vLLM's older API)."""
        cows = self.append_slots(seq)
        return cows[0] if cows else None

    def _promote_full_blocks(self, seq: Sequence, table: BlockTable) -> None:
        """Hash blocks filled (and computed) since the last call; merge each into an identical cached block.

        Written KV covers the tokens before ``num_scheduled_tokens`` (the previous call's length); the newest token
        and lookahead slots are not written yet.
        """
        num_full = table.num_scheduled_tokens // self.block_size
        if len(table.block_hashes) >= num_full:
            return
        token_ids = seq.get_token_ids()
        start = len(table.block_hashes)
        table.block_hashes = self._chain(token_ids, num_full, table.block_hashes)
        for i in range(start, num_full):
            prev = table.block_hashes[i - 1] if i else None
            tokens = self._block_tokens(token_ids, i)
            table[i] = self.gpu_allocator.promote(table[i], table.block_hashes[i], prev, tokens)

    # ------------------------------------------------------------ fork / free
    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child shares all of the parent's blocks (ref count +1 each) until one of them writes."""
        parent = self._table(parent_seq)
        if child_seq.seq_id in self.block_tables:
            raise ValueError(f"sequence {child_seq.seq_id} already has blocks")
        for block in parent:
            self._allocator(block.device).incr_ref(block)
        self.block_tables[child_seq.seq_id] = parent.copy()

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody else holds become free (or cached-evictable)."""
        table = self._table(seq)
        del self.block_tables[seq.seq_id]
        for block in reversed(table.blocks):  # deepest first: the LRU evictor then drops chain tails first
            self._allocator(block.device).free(block)

    def reset(self) -> None:
        for seq_id in list(self.block_tables):
            table = self.block_tables.pop(seq_id)
            for block in reversed(table.blocks):
                self._allocator(block.device).free(block)

    # ------------------------------------------------------------------- swap
    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return len(self._unique_blocks(seq_group, SequenceStatus.RUNNING)) <= self.cpu_allocator.get_num_free_blocks()

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's RUNNING sequences to CPU blocks; returns ``(gpu_block, cpu_block)`` pairs to copy."""
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """Whether the SWAPPED sequences fit back on the GPU, leaving each room for one more block."""
        blocks = self._unique_blocks(seq_group, SequenceStatus.SWAPPED)
        num_seqs = seq_group.num_seqs(SequenceStatus.SWAPPED)
        num_required = len(blocks) + num_seqs * (1 + self._num_blocks(num_lookahead_slots))
        if self.num_total_gpu_blocks < num_required:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Bring the group's SWAPPED sequences back; returns ``(cpu_block, gpu_block)`` pairs to copy."""
        mapping = self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)
        if self.enable_caching:  # swapped-in full blocks hold known content again: make them findable
            for seq in seq_group.get_seqs(status=SequenceStatus.SWAPPED):
                table, token_ids = self._table(seq), seq.get_token_ids()
                for i, block_hash in enumerate(table.block_hashes):
                    prev = table.block_hashes[i - 1] if i else None
                    self.gpu_allocator.register(table[i], block_hash, prev, self._block_tokens(token_ids, i))
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
                table[i] = new
                src.free(block)
        return [(b.block_number, moved[id(b)].block_number) for b in blocks]

    # ---------------------------------------------------------------- queries
    def get_block_table(self, seq: Sequence) -> list[int]:
        return self._table(seq).physical_block_ids()

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()

    def get_kv_utilization(self) -> float:
        """Token slots filled / slots in the GPU blocks held by live sequences (shared blocks counted once)."""
        fill: dict[int, int] = {}
        for table in self.block_tables.values():
            for i, block in enumerate(table):
                if block.device == Device.GPU:
                    fill[block.block_number] = max(fill.get(block.block_number, 0), table.num_tokens_in_block(i))
        return sum(fill.values()) / (len(fill) * self.block_size) if fill else 0.0

    def get_prefix_cache_hit_rate(self, device: Device = Device.GPU) -> float:
        return self._allocator(device).get_prefix_cache_hit_rate()

    def mark_blocks_as_computed(self, seq_group: SequenceGroup, num_computed_tokens: int | None = None) -> None:
        """After a forward pass: the full blocks within the first ``num_computed_tokens`` (default: every reserved
        slot) of each unfinished sequence now hold real KV, so prefix-cache hits on them may skip compute."""
        for seq in seq_group.get_unfinished_seqs():
            table = self.block_tables.get(seq.seq_id)
            if table is None:
                continue
            limit = table.num_tokens if num_computed_tokens is None else min(num_computed_tokens, table.num_tokens)
            for block in table.blocks[: limit // self.block_size]:
                block.computed = True

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        """The longest run of leading blocks that are computed and shared by all ``seqs`` (prefill can skip them).

        A prompt fully covered by cached blocks still has its last block dropped, so the model runs on at least
        one token and produces logits (vLLM does the same).
        """
        if not self.enable_caching or not seqs:
            return []
        tables = [self._table(s) for s in seqs]
        common: list[int] = []
        for blocks in zip(*(t.blocks for t in tables)):
            if not all(b is blocks[0] for b in blocks) or not blocks[0].computed:
                break
            common.append(blocks[0].block_number)
        if common and len(common) * self.block_size >= min(s.get_len() for s in seqs):
            common.pop()
        return common
