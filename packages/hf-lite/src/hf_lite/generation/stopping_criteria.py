"""Stopping criteria (transformers' ``generation/stopping_criteria.py``): each returns a per-row "done" bool tensor."""

from __future__ import annotations

import logging
import os
import time

import torch

logger = logging.getLogger(__name__)


class StoppingCriteria:
    """Base class: ``__call__(input_ids, scores) -> BoolTensor (batch,)``."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs) -> torch.BoolTensor:
        raise TypeError(f"{type(self).__name__} is abstract; subclasses implement __call__")


class StoppingCriteriaList(list):
    """A row is done when any criterion says so."""

    def __call__(self, input_ids, scores=None, **kwargs) -> torch.BoolTensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for criterion in self:
            done = done | criterion(input_ids, scores, **kwargs)
        return done

    @property
    def max_length(self) -> int | None:
        return next((c.max_length for c in self if isinstance(c, MaxLengthCriteria)), None)


class MaxLengthCriteria(StoppingCriteria):
    """Stop at ``max_length`` total tokens (prompt included)."""

    def __init__(self, max_length: int, max_position_embeddings: int | None = None):
        if not isinstance(max_length, int) or max_length <= 0:
            raise ValueError(f"`max_length` has to be a strictly positive integer, but is {max_length!r}")
        self.max_length = max_length
        self.max_position_embeddings = max_position_embeddings

    def __call__(self, input_ids, scores=None, **kwargs):
        cur_len = input_ids.shape[-1]
        if self.max_position_embeddings is not None and cur_len >= self.max_position_embeddings:
            logger.warning(
                "This is a friendly reminder - the current text generation call has exceeded the model's predefined "
                "maximum length (%d).",
                self.max_position_embeddings,
            )
        return torch.full((input_ids.shape[0],), cur_len >= self.max_length, dtype=torch.bool, device=input_ids.device)


class MaxNewTokensCriteria(StoppingCriteria):
    """Stop after ``max_new_tokens`` tokens past ``start_length``."""

    def __init__(self, start_length: int, max_new_tokens: int):
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"`max_new_tokens` has to be a strictly positive integer, but is {max_new_tokens!r}")
        self.start_length = start_length
        self.max_new_tokens = max_new_tokens
        self.max_length = start_length + max_new_tokens

    def __call__(self, input_ids, scores=None, **kwargs):
        done = input_ids.shape[-1] >= self.max_length
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class MaxTimeCriteria(StoppingCriteria):
    """Stop every row once ``max_time`` seconds have passed since ``initial_timestamp`` (construction by default)."""

    def __init__(self, max_time: float, initial_timestamp: float | None = None):
        if not max_time > 0:
            raise ValueError(f"`max_time` has to be a positive number of seconds, but is {max_time!r}")
        self.max_time = max_time
        self.initial_timestamp = time.time() if initial_timestamp is None else initial_timestamp

    def __call__(self, input_ids, scores=None, **kwargs):
        done = time.time() - self.initial_timestamp > self.max_time
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class EosTokenCriteria(StoppingCriteria):
    """A row is done when its last token is one of the EOS ids."""

    def __init__(self, eos_token_id: int | list[int] | torch.Tensor):
        if not isinstance(eos_token_id, torch.Tensor):
            if isinstance(eos_token_id, int):
                eos_token_id = [eos_token_id]
            eos_token_id = torch.tensor(eos_token_id)
        self.eos_token_id = eos_token_id.reshape(-1)

    def __call__(self, input_ids, scores=None, **kwargs):
        return torch.isin(input_ids[:, -1], self.eos_token_id.to(input_ids.device))


class StopStringCriteria(StoppingCriteria):
    """Stop when a stop string ends inside the newest token (transformers' ``StopStringCriteria``).

    transformers precomputes token/string overlap tables on the tokens' bytes; decoding a bounded tail gives the same
    decision. The newest token's text starts where the decodes with and without it stop agreeing: a character split
    over byte tokens decodes to U+FFFD until its last byte arrives, so a length measured on the shorter decode would
    point past the character and miss a stop string that ends in it.
    """

    def __init__(self, tokenizer, stop_strings: str | list[str]):
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if not stop_strings or any(not isinstance(s, str) or not s for s in stop_strings):
            raise ValueError(f"`stop_strings` must be non-empty strings, got {stop_strings!r}")
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        # Every token decodes to at least one byte, so this many tokens always covers the longest stop string.
        self.tail_tokens = max(len(s.encode("utf-8")) for s in self.stop_strings) + 1

    def __call__(self, input_ids, scores=None, **kwargs):
        done = []
        for row in input_ids.tolist():
            tail = row[-self.tail_tokens :]
            text = self.tokenizer.decode(tail)
            new_from = len(os.path.commonprefix([text, self.tokenizer.decode(tail[:-1])]))
            done.append(any(text.find(s, max(0, new_from - len(s) + 1)) != -1 for s in self.stop_strings))
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
