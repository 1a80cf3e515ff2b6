"""``SchedulingBudget`` (vLLM ``core/scheduler.py``): tokens and sequences one step may still take.

Adds and subtracts are idempotent per request id, so a group counted while scanning the running queue and again
when it is preempted is counted once.
"""

from __future__ import annotations


class SchedulingBudget:
    def __init__(self, token_budget: int, max_num_seqs: int):
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self._tokens: dict[str, int] = {}
        self._seqs: dict[str, int] = {}

    @property
    def num_batched_tokens(self) -> int:
        return sum(self._tokens.values())

    @property
    def num_curr_seqs(self) -> int:
        return sum(self._seqs.values())

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        if num_new_tokens <= 0:
            return False
        return (
            self.num_batched_tokens + num_new_tokens <= self.token_budget
            and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, req_id: str, num_batched_tokens: int) -> None:
        self._tokens.setdefault(req_id, num_batched_tokens)

    def subtract_num_batched_tokens(self, req_id: str, num_batched_tokens: int) -> None:
        self._tokens.pop(req_id, None)

    def add_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        self._seqs.setdefault(req_id, num_curr_seqs)

    def subtract_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        self._seqs.pop(req_id, None)
