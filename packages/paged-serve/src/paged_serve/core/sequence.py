"""``Sequence`` / ``SequenceGroup`` (vLLM ``vllm/sequence.py``): the token ids and progress the scheduler works on.

A request is a ``SequenceGroup``; parallel sampling / beam search fork it into several ``Sequence`` s that share
the prompt's KV blocks. Each sequence counts the tokens whose KV is computed (``num_computed_tokens``): a prefill
(possibly in chunks) computes everything not yet computed, a decode step one token. Recompute preemption resets
that count, so prompt and generated tokens are prefilled again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field


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

    @staticmethod
    def get_finished_reason(status: SequenceStatus) -> str | None:
        """OpenAI's ``finish_reason``: stop, length, abort, or None while unfinished."""
        return {
            SequenceStatus.FINISHED_STOPPED: "stop",
            SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
            SequenceStatus.FINISHED_ABORTED: "abort",
            SequenceStatus.FINISHED_IGNORED: "length",  # vLLM reports an ignored (too long) prompt as length
        }.get(status)


class SequenceStage(enum.Enum):
    PREFILL = enum.auto()
    DECODE = enum.auto()


@dataclass
class Logprob:
    """A token's log-probability, its rank in the distribution (1 = most likely) and its text (vLLM ``Logprob``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class Sequence:
    """One generated sequence: prompt token ids plus the tokens appended so far, and how many have KV."""

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: Iterable[int],
        block_size: int,
        prompt: str | None = None,
        eos_token_id: int | None = None,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.seq_id = seq_id
        self.prompt = prompt
        self.prompt_token_ids = [int(t) for t in prompt_token_ids]
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[dict[int, Logprob] | None] = []
        self.cumulative_logprob = 0.0
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.status = SequenceStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_text = ""
        self.num_computed_tokens = 0
        self._stage = SequenceStage.PREFILL

    # --------------------------------------------------------------- tokens
    def append_token_id(self, token_id: int, logprobs: dict[int, Logprob] | None = None) -> None:
        """Append a sampled token; ``logprobs`` maps token ids (the sampled one among them) to their ``Logprob``."""
        token_id = int(token_id)
        self.output_token_ids.append(token_id)
        self.output_logprobs.append(logprobs)
        if logprobs and token_id in logprobs:
            self.cumulative_logprob += logprobs[token_id].logprob

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

    # ------------------------------------------------------------ progress
    def get_num_uncomputed_tokens(self) -> int:
        return self.get_len() - self.num_computed_tokens

    def get_num_new_tokens(self) -> int:
        """Tokens the next step computes: everything uncomputed in prefill, one token in decode."""
        return 1 if self._stage == SequenceStage.DECODE else self.get_num_uncomputed_tokens()

    def is_prefill(self) -> bool:
        return self._stage == SequenceStage.PREFILL

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """After a step computed ``num_new_computed_tokens`` more tokens' KV; prefill ends when none are left."""
        if num_new_computed_tokens < 0 or num_new_computed_tokens > self.get_num_uncomputed_tokens():
            raise ValueError(
                f"sequence {self.seq_id}: cannot compute {num_new_computed_tokens} tokens, "
                f"{self.get_num_uncomputed_tokens()} uncomputed"
            )
        self.num_computed_tokens += num_new_computed_tokens
        if self.get_num_uncomputed_tokens() == 0:
            self._stage = SequenceStage.DECODE

    def reset_state_for_recompute(self) -> None:
        """Preempted by recompute: its KV is gone, so prompt and outputs are prefilled again."""
        self.num_computed_tokens = 0
        self._stage = SequenceStage.PREFILL

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def get_beam_search_score(self, length_penalty: float = 1.0, seq_len: int | None = None) -> float:
        """Cumulative logprob over generated length ** length_penalty (transformers' ``BeamHypotheses.add``)."""
        seq_len = self.get_output_len() if seq_len is None else seq_len
        return self.cumulative_logprob / (max(seq_len, 1) ** length_penalty)

    def fork(self, new_seq_id: int) -> Sequence:
        child = Sequence(new_seq_id, self.prompt_token_ids, self.block_size, self.prompt, self.eos_token_id)
        child.output_token_ids = list(self.output_token_ids)
        child.output_logprobs = list(self.output_logprobs)
        child.cumulative_logprob = self.cumulative_logprob
        child.output_text = self.output_text
        child.status = self.status
        child.num_computed_tokens = self.num_computed_tokens
        child._stage = self._stage
        return child

    def __repr__(self) -> str:
        return f"Sequence(seq_id={self.seq_id}, status={self.status.name}, num_tokens={self.get_len()})"


@dataclass
class RequestMetrics:
    """Timestamps of a request's life (vLLM ``RequestMetrics``): for latency statistics."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0


class SequenceGroup:
    """The sequences generated from one prompt (one request)."""

    def __init__(
        self,
        request_id: str,
        seqs: list[Sequence],
        arrival_time: float | None = None,
        sampling_params=None,
    ):
        if not seqs:
            raise ValueError(f"SequenceGroup {request_id!r} needs at least one sequence")
        self.request_id = request_id
        self.seqs_dict = {seq.seq_id: seq for seq in seqs}
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.sampling_params = sampling_params
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.ignored_reason: str | None = None
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first scheduling
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # [None, token 1's, ...]

    @property
    def prompt_token_ids(self) -> list[int]:
        return next(iter(self.seqs_dict.values())).prompt_token_ids

    @property
    def prompt(self) -> str | None:
        return next(iter(self.seqs_dict.values())).prompt

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        seqs = list(self.seqs_dict.values())
        return seqs if status is None else [s for s in seqs if s.status == status]

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs_dict.values() if not s.is_finished()]

    def get_finished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs_dict.values() if s.is_finished()]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))

    def num_unfinished_seqs(self) -> int:
        return len(self.get_unfinished_seqs())

    def get_max_num_running_seqs(self) -> int:
        """Sequences this group will run at once: ``best_of`` before its first sample forks it, then its live ones."""
        params = self.sampling_params
        if params is not None and len(self.seqs_dict) == 1:
            seq = next(iter(self.seqs_dict.values()))
            if not seq.output_token_ids:
                return max(params.n, params.best_of or params.n)
        return self.num_unfinished_seqs()

    def is_prefill(self) -> bool:
        return any(s.is_prefill() for s in self.get_unfinished_seqs())

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """A step computed up to ``num_new_computed_tokens`` tokens of each unfinished sequence (a decode: one)."""
        for seq in self.get_unfinished_seqs():
            seq.update_num_computed_tokens(min(num_new_computed_tokens, seq.get_num_uncomputed_tokens()))

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


@dataclass
class SequenceGroupMetadata:
    """What the model runner needs of one scheduled group (vLLM ``SequenceGroupMetadata``)."""

    request_id: str
    is_prompt: bool
    seq_data: dict[int, Sequence]
    sampling_params: object
    block_tables: dict[int, list[int]]
    token_chunk_size: int
    do_sample: bool = True
    computed_block_nums: list[int] = field(default_factory=list)
