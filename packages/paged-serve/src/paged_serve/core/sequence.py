"""A minimal ``Sequence`` / ``SequenceGroup`` (vLLM ``vllm/sequence.py``): the token ids the block manager works on.

A request is a ``SequenceGroup``; parallel sampling / beam search fork it into several ``Sequence`` s that share
the prompt's KV blocks. The scheduler (next layer) moves sequences between statuses; the block manager reads
them: ``allocate`` takes the WAITING ones, ``swap_out`` the RUNNING ones, ``swap_in`` the SWAPPED ones.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        return status.name.startswith("FINISHED")


class Sequence:
    """One generated sequence: prompt token ids plus the tokens appended so far."""

    def __init__(self, seq_id: int, prompt_token_ids: Iterable[int], block_size: int, prompt: str | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.seq_id = seq_id
        self.prompt = prompt
        self.prompt_token_ids = [int(t) for t in prompt_token_ids]
        self.output_token_ids: list[int] = []
        self.block_size = block_size
        self.status = SequenceStatus.WAITING

    def append_token_id(self, token_id: int, logprobs: dict | None = None) -> None:
        self.output_token_ids.append(int(token_id))

    def get_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def get_len(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def get_output_len(self) -> int:
        return len(self.output_token_ids)

    def get_last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def n_blocks(self) -> int:
        """Logical blocks needed to hold every token."""
        return -(-self.get_len() // self.block_size)

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def fork(self, new_seq_id: int) -> Sequence:
        child = Sequence(new_seq_id, self.prompt_token_ids, self.block_size, self.prompt)
        child.output_token_ids = list(self.output_token_ids)
        child.status = self.status
        return child

    def __repr__(self) -> str:
        return f"Sequence(seq_id={self.seq_id}, status={self.status.name}, num_tokens={self.get_len()})"


class SequenceGroup:
    """The sequences generated from one prompt (one request)."""

    def __init__(self, request_id: str, seqs: list[Sequence], arrival_time: float | None = None, sampling_params=None):
        if not seqs:
            raise ValueError(f"SequenceGroup {request_id!r} needs at least one sequence")
        self.request_id = request_id
        self.seqs_dict = {seq.seq_id: seq for seq in seqs}
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.sampling_params = sampling_params

    @property
    def prompt_token_ids(self) -> list[int]:
        return next(iter(self.seqs_dict.values())).prompt_token_ids

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        seqs = list(self.seqs_dict.values())
        return seqs if status is None else [s for s in seqs if s.status == status]

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs_dict.values() if not s.is_finished()]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))

    def find(self, seq_id: int) -> Sequence:
        if seq_id not in self.seqs_dict:
            raise ValueError(f"sequence {seq_id} not in group {self.request_id!r}")
        return self.seqs_dict[seq_id]

    def add(self, seq: Sequence) -> None:
        if seq.seq_id in self.seqs_dict:
            raise ValueError(f"sequence {seq.seq_id} already in group {self.request_id!r}")
        self.seqs_dict[seq.seq_id] = seq

    def remove(self, seq_id: int) -> None:
        self.find(seq_id)
        del self.seqs_dict[seq_id]

    def is_finished(self) -> bool:
        return all(s.is_finished() for s in self.seqs_dict.values())

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id!r}, num_seqs={len(self.seqs_dict)})"
