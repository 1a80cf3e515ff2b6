"""``PhysicalBlock`` (a KV-cache block on one device) and ``BlockTable`` (a sequence's logical -> physical map).

PagedAttention paper section 4.2: a sequence's logical blocks are contiguous, its physical blocks can be anywhere;
the block table is the indirection the attention kernel reads. Blocks carry a reference count so forked
sequences share them until one writes (copy-on-write, section 4.4).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator


class Device(enum.Enum):
    GPU = enum.auto()
    CPU = enum.auto()


class PhysicalBlock:
    """One block of ``block_size`` token slots in a device's KV pool.

    ``block_hash``/``token_ids``/``parent`` are set only for full blocks under prefix caching: the chained hash is
    the cache key; a hit also needs the same token ids *and* the same physical predecessor block still holding the
    content it held when this block was cached (``parent_version``), so a hash collision anywhere in the chain
    cannot hand out KV computed after another prefix. ``version`` counts how often the block's content was
    cleared. ``computed`` turns true once the model has written the block's KV.
    """

    __slots__ = (
        "device",
        "block_number",
        "block_size",
        "ref_count",
        "block_hash",
        "token_ids",
        "parent",
        "parent_version",
        "version",
        "computed",
    )

    def __init__(self, device: Device, block_number: int, block_size: int):
        self.device = device
        self.block_number = block_number
        self.block_size = block_size
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.parent: PhysicalBlock | None = None
        self.parent_version = 0
        self.version = 0
        self.computed = False

    def clear_content(self) -> None:
        """Forget cached content when the block is handed out for new tokens."""
        self.block_hash = None
        self.token_ids = None
        self.parent = None
        self.computed = False
        self.version += 1

    def __repr__(self) -> str:
        return (
            f"PhysicalBlock(device={self.device.name}, block_number={self.block_number}, "
            f"ref_count={self.ref_count}, hashed={self.block_hash is not None})"
        )


class BlockTable:
    """The physical blocks of one sequence, in logical order, and how many token slots are reserved in them.

    ``num_tokens`` counts reserved slots (lookahead included); ``num_scheduled_tokens`` is the sequence's length at
    the last allocate / append: the step that follows writes the KV of every token before it, so slots below it are
    written and slots from it on are about to be. ``block_hashes`` holds the prefix-cache chain hashes of the leading
    full blocks hashed so far; it belongs to the sequence's content, not to the physical blocks, so it survives
    swaps and merges. ``num_promoted`` leading blocks have been offered to the prefix cache after their KV was
    computed (``mark_blocks_as_computed``).
    """

    def __init__(
        self,
        blocks: Iterable[PhysicalBlock] = (),
        num_tokens: int = 0,
        block_hashes: Iterable[int] = (),
        num_scheduled_tokens: int | None = None,
    ):
        self.blocks: list[PhysicalBlock] = list(blocks)
        self.num_tokens = num_tokens
        self.block_hashes: list[int] = list(block_hashes)
        self.num_scheduled_tokens = num_tokens if num_scheduled_tokens is None else num_scheduled_tokens
        self.num_promoted = 0

    def physical_block_ids(self) -> list[int]:
        return [b.block_number for b in self.blocks]

    def append(self, block: PhysicalBlock) -> None:
        self.blocks.append(block)

    def copy(self) -> BlockTable:
        table = BlockTable(self.blocks, self.num_tokens, self.block_hashes, self.num_scheduled_tokens)
        table.num_promoted = self.num_promoted
        return table

    def num_tokens_in_block(self, index: int) -> int:
        """Reserved slots in logical block ``index`` (full blocks hold ``block_size``)."""
        block_size = self.blocks[index].block_size
        return max(0, min(block_size, self.num_tokens - index * block_size))

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[PhysicalBlock]:
        return iter(self.blocks)

    def __getitem__(self, index: int) -> PhysicalBlock:
        return self.blocks[index]

    def __setitem__(self, index: int, block: PhysicalBlock) -> None:
        self.blocks[index] = block

    def __repr__(self) -> str:
        return f"BlockTable({self.physical_block_ids()}, num_tokens={self.num_tokens})"
