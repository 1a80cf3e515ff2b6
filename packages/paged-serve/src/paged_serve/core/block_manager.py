"""``BlockSpaceManager``: maps every sequence's logical KV blocks to physical blocks (vLLM ``block_manager_v1``).

The scheduler asks it whether a request fits (``can_allocate`` -> OK / LATER / NEVER), reserves slots as
sequences grow (``append_slots``, returning copy-on-write pairs for ``copy_blocks``), shares blocks between forked
sequences (PagedAttention paper section 4.4), and moves whole sequence groups to CPU and back under memory
pressure (``swap_out``/``swap_in`` return the block mappings for ``swap_blocks``, section 4.5). A watermark of
GPU blocks is kept free at admission so running sequences can still grow without immediate preemption.

Contract with the engine: ``allocate`` / ``append_slots`` reserve slots for a sequence's tokens before the forward
pass that writes their KV; ``mark_blocks_as_computed`` after that pass says which tokens now have KV. Only then are
full blocks offered to the prefix cache (hashed, merged into an identical cached block), so a block is never
cached before its last slot is written, however often slots are reserved in between.
"""

from __future__ import annotations

from paged_serve.core.alloc_status import AllocStatus
from paged_serve.core.block import BlockTable, Device, PhysicalBlock
from paged_serve.core.block_allocator import BlockAllocator, NoFreeBlocksError
from paged_serve.core.prefix_caching import HashFn, PrefixCachingBlockAllocator, hash_block_tokens
from paged_serve.core.sequence import Sequence, SequenceGroup, SequenceStatus
from paged_serve.core.swap import SwapMixin


class UnknownSequenceError(KeyError):
    """The sequence has no block table: never allocated, or already freed."""


class BlockSpaceManager(SwapMixin):
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
    def _distinct_prompts(self, seqs: list[Sequence]) -> list[tuple[list[int], list[Sequence]]]:
        """WAITING sequences grouped by their tokens: fresh groups have one entry, a recomputed fork several."""
        by_tokens: dict[tuple[int, ...], list[Sequence]] = {}
        for seq in seqs:
            by_tokens.setdefault(tuple(seq.get_token_ids()), []).append(seq)
        return [(list(tokens), group) for tokens, group in by_tokens.items()]

    def _num_shared_full_blocks(self, a: list[int], b: list[int]) -> int:
        """Leading full blocks two token lists have in common: their KV is identical, so they can share them."""
        n, i = min(len(a), len(b)) // self.block_size, 0
        while i < n and self._block_tokens(a, i) == self._block_tokens(b, i):
            i += 1
        return i

    def _best_share(self, prompts: list[list[int]], k: int) -> tuple[int, int]:
        """(index of an earlier prompt, number of leading full blocks prompt ``k`` can share with it)."""
        best = (0, 0)
        for j in range(k):
            shared = self._num_shared_full_blocks(prompts[j], prompts[k])
            if shared > best[1]:
                best = (j, shared)
        return best

    def _num_cached_in_use(self, token_ids: list[int]) -> int:
        """Leading full blocks of ``token_ids`` that live sequences already hold in the cache (free to share).

        The walk stops at the first miss: a hit must follow the block the sequence would hold just before.
        """
        if not self.enable_caching:
            return 0
        hashes = self._chain(token_ids, len(token_ids) // self.block_size, [])
        parent, in_use = None, 0
        for i, block_hash in enumerate(hashes):
            parent = self.gpu_allocator.lookup(block_hash, self._block_tokens(token_ids, i), parent)
            if parent is None:
                break
            in_use += parent.ref_count > 0
        return in_use

    def _num_required_blocks(self, seqs: list[Sequence]) -> tuple[int, int]:
        """(free blocks the group's prompts take now, blocks they would take in an empty cache)."""
        prompts = [tokens for tokens, _ in self._distinct_prompts(seqs)]
        total = 0
        for k, tokens in enumerate(prompts):
            total += self._num_blocks(len(tokens)) - self._best_share(prompts, k)[1]
        return total - self._num_cached_in_use(prompts[0]), total

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Whether the group's prompt fits: blocks beyond the watermark free now (OK), later, or never."""
        seqs = seq_group.get_seqs(status=SequenceStatus.WAITING) or seq_group.get_seqs()
        num_required, num_total = self._num_required_blocks(seqs)
        if self.num_total_gpu_blocks - num_total < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def get_num_cached_tokens(self, seq_group: SequenceGroup) -> int:
        """Leading prompt tokens of a WAITING group whose KV is cached and computed: what its prefill can skip.

        The scheduler budgets ``prompt length - this`` tokens for admission. The last token is always computed (the
        model has to produce its logits), as in ``get_common_computed_block_ids``.
        """
        seqs = seq_group.get_seqs(status=SequenceStatus.WAITING)
        if not self.enable_caching or not seqs:
            return 0
        token_ids = seqs[0].get_token_ids()
        hashes = self._chain(token_ids, len(token_ids) // self.block_size, [])
        parent, num_blocks = None, 0
        for i, block_hash in enumerate(hashes):
            parent = self.gpu_allocator.lookup(block_hash, self._block_tokens(token_ids, i), parent)
            if parent is None or not parent.computed:
                break
            num_blocks += 1
        if len({tuple(s.get_token_ids()) for s in seqs}) > 1:
            return 0  # a recomputed fork whose sequences diverged: budget every token (an upper bound)
        num_tokens = num_blocks * self.block_size
        return num_tokens - self.block_size if num_tokens and num_tokens >= len(token_ids) else num_tokens

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Reserve blocks for the WAITING sequences' tokens, each sized from its own tokens.

        Sequences with equal tokens share one table (ref count per sequence); a recomputed fork whose sequences
        diverged shares the leading full blocks they have in common. With prefix caching, full prompt blocks are
        looked up in the cache first (a hit shares a block another request computed).
        """
        seqs = seq_group.get_seqs(status=SequenceStatus.WAITING)
        if not seqs:
            raise ValueError(f"{seq_group} has no WAITING sequence to allocate")
        for seq in seqs:
            if seq.seq_id in self.block_tables:
                raise ValueError(f"sequence {seq.seq_id} already has blocks")
            if not seq.get_len():
                raise ValueError(f"sequence {seq.seq_id} has no tokens to allocate")
        num_required, _ = self._num_required_blocks(seqs)
        if num_required > self.gpu_allocator.get_num_free_blocks():
            raise NoFreeBlocksError(
                f"group {seq_group.request_id!r} needs {num_required} new blocks, "
                f"{self.gpu_allocator.get_num_free_blocks()} free"
            )
        distinct = self._distinct_prompts(seqs)
        prompts = [tokens for tokens, _ in distinct]
        tables: list[BlockTable] = []
        for k, (token_ids, same) in enumerate(distinct):
            source, num_shared = self._best_share(prompts, k)
            num_full = len(token_ids) // self.block_size
            table = BlockTable(num_tokens=len(token_ids))
            if self.enable_caching:
                inherited = tables[source].block_hashes[:num_shared] if num_shared else []
                table.block_hashes = self._chain(token_ids, num_full, inherited)
            for i in range(self._num_blocks(len(token_ids))):
                if i < num_shared:
                    block = tables[source][i]
                    self.gpu_allocator.incr_ref(block)
                elif self.enable_caching and i < num_full:
                    parent = table[i - 1] if i else None
                    tokens = self._block_tokens(token_ids, i)
                    block = self.gpu_allocator.allocate_cached(table.block_hashes[i], tokens, parent)
                else:
                    block = self.gpu_allocator.allocate()
                table.append(block)
            tables.append(table)
            self.block_tables[same[0].seq_id] = table
            for seq in same[1:]:
                for block in table:
                    self.gpu_allocator.incr_ref(block)
                self.block_tables[seq.seq_id] = table.copy()

    # ----------------------------------------------------------------- growth
    def _shared_blocks_to_write(self, table: BlockTable, target: int, refs: dict[int, int] | None = None) -> list[int]:
        """Indices of existing blocks the next step writes into (slots ``num_scheduled_tokens`` .. ``target``) that
        another sequence also holds (``refs`` overrides ref counts): each needs a private copy first (CoW)."""
        if target <= table.num_scheduled_tokens:
            return []
        first = table.num_scheduled_tokens // self.block_size
        end = min(len(table), self._num_blocks(target))
        refs = refs or {}
        return [i for i in range(first, end) if refs.get(id(table[i]), table[i].ref_count) > 1]

    def _num_new_blocks(self, seqs: list[Sequence], num_lookahead_slots: int) -> int:
        """Blocks ``append_slots`` takes for each of ``seqs`` in turn: new tail blocks plus copy-on-write copies.

        A shared block written by several of them is copied for all but the last writer, who then holds it alone
        (the reference counts are followed as the calls would change them).
        """
        refs: dict[int, int] = {}
        needed = 0
        for seq in seqs:
            table = self._table(seq)
            target = seq.get_len() + num_lookahead_slots
            needed += max(0, self._num_blocks(target) - len(table))
            for i in self._shared_blocks_to_write(table, target, refs):
                refs[id(table[i])] = refs.get(id(table[i]), table[i].ref_count) - 1
                needed += 1
        return needed

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """Whether every RUNNING sequence of the group can reserve slots for its new tokens right now."""
        needed = self._num_new_blocks(seq_group.get_seqs(SequenceStatus.RUNNING), num_lookahead_slots)
        return needed <= self.gpu_allocator.get_num_free_blocks()

    def can_append_slot(self, seq_group: SequenceGroup) -> bool:
        return self.can_append_slots(seq_group, 0)

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Reserve slots up to ``seq.get_len() + num_lookahead_slots`` tokens.

        Returns the copy-on-write ``(src, dst)`` block pairs the engine must copy before writing: a shared block
        about to receive the new token (at most one without lookahead: the shared, partially filled last block).
        Raises ``NoFreeBlocksError`` without changing anything when the GPU pool cannot cover it. Calling it again
        before the forward pass only reserves more; nothing is cached until ``mark_blocks_as_computed``.
        """
        table = self._table(seq)
        needed = self._num_new_blocks([seq], num_lookahead_slots)
        free = self.gpu_allocator.get_num_free_blocks()
        if needed > free:
            raise NoFreeBlocksError(f"sequence {seq.seq_id} needs {needed} new blocks, {free} free")
        target = seq.get_len() + num_lookahead_slots
        cows: list[tuple[int, int]] = []
        for i in self._shared_blocks_to_write(table, target):
            shared, fresh = table[i], self.gpu_allocator.allocate()
            fresh.computed = shared.computed  # the copy carries the KV written so far
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

    def _promote_computed_blocks(self, seq: Sequence, table: BlockTable, num_computed_blocks: int) -> None:
        """Offer full blocks whose KV was just computed to the prefix cache; merge each into an identical one."""
        token_ids = seq.get_token_ids()
        table.block_hashes = self._chain(
            token_ids, max(num_computed_blocks, len(table.block_hashes)), table.block_hashes
        )
        for i in range(table.num_promoted, num_computed_blocks):
            parent = table[i - 1] if i else None
            tokens = self._block_tokens(token_ids, i)
            table[i] = self.gpu_allocator.promote(table[i], table.block_hashes[i], tokens, parent)
        table.num_promoted = max(table.num_promoted, num_computed_blocks)

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
        """Drop the sequence's references; blocks nobody else holds become free (or cached-evictable).

        A sequence without blocks (never allocated, e.g. aborted while WAITING, or already freed) is a no-op, as
        in vLLM: abort and finish paths may both free.
        """
        table = self.block_tables.pop(seq.seq_id, None)
        if table is None:
            return
        for block in reversed(table.blocks):  # deepest first: the LRU evictor then drops chain tails first
            self._allocator(block.device).free(block)

    def reset(self) -> None:
        for seq_id in list(self.block_tables):
            table = self.block_tables.pop(seq_id)
            for block in reversed(table.blocks):
                self._allocator(block.device).free(block)

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
        """After a forward pass: the first ``num_computed_tokens`` tokens of each unfinished sequence (default:
        every token scheduled by its last allocate / append) now hold KV. Their full blocks are marked computed
        and, with prefix caching, hashed and cached or merged into an identical cached block."""
        for seq in seq_group.get_unfinished_seqs():
            table = self.block_tables.get(seq.seq_id)
            if table is None:
                continue
            limit = table.num_scheduled_tokens if num_computed_tokens is None else num_computed_tokens
            num_blocks = min(limit, table.num_scheduled_tokens, seq.get_len()) // self.block_size
            if self.enable_caching and table[0].device == Device.GPU:
                self._promote_computed_blocks(seq, table, num_blocks)
            for block in table.blocks[:num_blocks]:
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
