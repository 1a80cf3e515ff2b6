"""More of transformers' ``generation/logits_process.py``: processors a script builds itself and passes to
``generate(logits_processor=LogitsProcessorList([...]))``. Each maps ``(input_ids, scores)`` to new scores like the
core ones (``generation/logits_process.py``); ``generate`` does not build these from ``GenerationConfig`` fields."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...generation.logits_process import LogitsProcessor, _eos_tensor


def _check_cutoff(name: str, value: float, min_tokens_to_keep: int) -> float:
    value = float(value)
    if not 0 < value < 1:
        raise ValueError(f"`{name}` has to be a float > 0 and < 1, but is {value}")
    if int(min_tokens_to_keep) < 1:
        raise ValueError(f"`min_tokens_to_keep` has to be a strictly positive integer, but is {min_tokens_to_keep}")
    return value


def _keep_at_least(scores: torch.Tensor, remove: torch.Tensor, min_tokens_to_keep: int) -> torch.Tensor:
    """``remove`` spared for the ``min_tokens_to_keep`` highest scores."""
    kth_best = torch.topk(scores, min(min_tokens_to_keep, scores.size(-1))).values[..., -1:]
    return remove & (scores < kth_best)


class TypicalLogitsWarper(LogitsProcessor):
    """Locally typical sampling (Meister et al. 2022, arXiv:2202.00666): keep the tokens whose surprisal is closest to
    the distribution's entropy until their probability mass reaches ``mass``."""

    def __init__(self, mass: float = 0.9, filter_value: float = -float("Inf"), min_tokens_to_keep: int = 1):
        self.mass = _check_cutoff("typical_p", mass, min_tokens_to_keep)
        if not isinstance(min_tokens_to_keep, int):
            raise ValueError(f"`min_tokens_to_keep` has to be a positive integer, but is {min_tokens_to_keep}")
        self.filter_value, self.min_tokens_to_keep = filter_value, min_tokens_to_keep

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        logp = scores.log_softmax(dim=-1)
        entropy = -(logp * logp.exp()).nansum(-1, keepdim=True)
        distance, order = (-logp - entropy).abs().sort(dim=-1)
        mass = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
        last = (mass < self.mass).sum(dim=1).clamp(max=distance.shape[-1] - 1)
        drop = distance > distance.gather(1, last.view(-1, 1))
        drop[..., : self.min_tokens_to_keep] = False
        return scores.masked_fill(drop.scatter(1, order, drop), self.filter_value)


class EpsilonLogitsWarper(LogitsProcessor):
    """Epsilon sampling (Hewitt et al. 2022, arXiv:2210.15191): drop tokens whose probability is below ``epsilon``."""

    def __init__(self, epsilon: float, filter_value: float = -float("Inf"), min_tokens_to_keep: int = 1):
        self.epsilon = _check_cutoff("epsilon_cutoff", epsilon, min_tokens_to_keep)
        self.filter_value, self.min_tokens_to_keep = filter_value, int(min_tokens_to_keep)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        remove = _keep_at_least(scores, scores.softmax(dim=-1) < self.epsilon, self.min_tokens_to_keep)
        return scores.masked_fill(remove, self.filter_value)


class EtaLogitsWarper(LogitsProcessor):
    """Eta sampling (arXiv:2210.15191): the cutoff is ``min(epsilon, sqrt(epsilon) * exp(-entropy))``."""

    def __init__(self, epsilon: float, filter_value: float = -float("Inf"), min_tokens_to_keep: int = 1,
                 device: str = "cpu"):
        self.epsilon = torch.tensor(_check_cutoff("eta_cutoff", epsilon, min_tokens_to_keep), device=device)
        self.filter_value, self.min_tokens_to_keep = filter_value, int(min_tokens_to_keep)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        entropy = torch.distributions.Categorical(logits=scores).entropy()
        eta = torch.min(self.epsilon, self.epsilon.sqrt() * torch.exp(-entropy))[..., None]
        remove = _keep_at_least(scores, scores.softmax(dim=-1) < eta, self.min_tokens_to_keep)
        return scores.masked_fill(remove, self.filter_value)


class LogitNormalization(LogitsProcessor):
    """Log-softmax of the scores (``renormalize_logits``)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.log_softmax(dim=-1)


class _ForcedToken(LogitsProcessor):
    def _force(self, scores: torch.Tensor, token_ids) -> torch.Tensor:
        forced = torch.full_like(scores, -math.inf)
        forced[:, token_ids] = 0
        return forced


class ForcedBOSTokenLogitsProcessor(_ForcedToken):
    """The first generated token is ``bos_token_id`` (when the input is one token long, as a decoder start)."""

    def __init__(self, bos_token_id: int):
        self.bos_token_id = bos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return self._force(scores, self.bos_token_id) if input_ids.shape[-1] == 1 else scores


class ForcedEOSTokenLogitsProcessor(_ForcedToken):
    """The token that reaches ``max_length`` is an EOS token."""

    def __init__(self, max_length: int, eos_token_id: int | list[int] | torch.Tensor, device: str = "cpu"):
        self.max_length, self.eos_token_id = max_length, _checked_eos(eos_token_id, device)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return self._force(scores, self.eos_token_id) if input_ids.shape[-1] == self.max_length - 1 else scores


def _checked_eos(eos_token_id, device="cpu") -> torch.Tensor:
    eos = eos_token_id if isinstance(eos_token_id, torch.Tensor) else _eos_tensor(eos_token_id, device)
    if torch.is_floating_point(eos) or (eos < 0).any():
        raise ValueError(f"`eos_token_id` has to be a list of positive integers, but is {eos_token_id}")
    return eos


class ExponentialDecayLengthPenalty(LogitsProcessor):
    """After ``start_index`` new tokens, the EOS scores grow by ``|score| * (decay_factor ** n - 1)`` at the n-th
    token past it, so sequences end sooner without a hard cut."""

    def __init__(self, exponential_decay_length_penalty: tuple[int, float],
                 eos_token_id: int | list[int] | torch.Tensor, input_ids_seq_length: int):
        self.regulation_start = exponential_decay_length_penalty[0] + input_ids_seq_length
        self.regulation_factor = exponential_decay_length_penalty[1]
        self.eos_token_id = _checked_eos(eos_token_id)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        past = input_ids.shape[-1] - self.regulation_start
        if past <= 0:
            return scores
        eos = self.eos_token_id.to(scores.device)
        eos_scores = scores[:, eos]
        penalty = (eos_scores.abs() * (self.regulation_factor**past - 1)).masked_fill(~eos_scores.isfinite(), 0.0)
        penalties = torch.zeros_like(scores)
        penalties[:, eos] = penalty
        return scores + penalties


class SuppressTokensAtBeginLogitsProcessor(LogitsProcessor):
    """``begin_suppress_tokens`` are impossible at position ``begin_index`` (the first generated token)."""

    def __init__(self, begin_suppress_tokens, begin_index, device: str = "cpu"):
        self.begin_suppress_tokens = torch.tensor(list(begin_suppress_tokens), device=device)
        self.begin_index = begin_index

    def set_begin_index(self, begin_index) -> None:
        self.begin_index = begin_index

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] != self.begin_index:
            return scores
        suppressed = torch.isin(torch.arange(scores.shape[-1], device=scores.device),
                                self.begin_suppress_tokens.to(scores.device))
        return scores.masked_fill(suppressed, -float("inf"))


class PrefixConstrainedLogitsProcessor(LogitsProcessor):
    """Constrained generation (De Cao et al. 2021, arXiv:2010.00904): only the tokens
    ``prefix_allowed_tokens_fn(batch_id, sequence)`` allows; a row whose allowed tokens all score -inf keeps the
    allowed set at 0 (still satisfiable)."""

    def __init__(self, prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], list[int]], num_beams: int):
        self._prefix_allowed_tokens_fn, self._num_beams = prefix_allowed_tokens_fn, num_beams

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        mask = torch.full_like(scores, -math.inf)
        for row, sequence in enumerate(input_ids):
            batch_id = row // self._num_beams
            allowed = self._prefix_allowed_tokens_fn(batch_id, sequence)
            if len(allowed) == 0:
                raise ValueError(f"`prefix_allowed_tokens_fn` returned an empty list for batch ID {batch_id}: the "
                                 "constraint is unsatisfiable")
            mask[row, allowed] = 0
        constrained = scores + mask
        dead = constrained.amax(dim=-1).isneginf().view(-1, self._num_beams).all(dim=-1, keepdim=True)
        return torch.where(dead.repeat_interleave(self._num_beams, dim=0), mask, constrained)


class SequenceBiasLogitsProcessor(LogitsProcessor):
    """Add a bias to a token when the tokens before it complete a given sequence: ``{(ids...): bias}`` or
    ``[[ids, bias], ...]``; a one-token sequence is biased everywhere."""

    def __init__(self, sequence_bias: list[list[list[int] | float]] | dict[tuple[int, ...], float]):
        if isinstance(sequence_bias, list) and sequence_bias:
            if any(len(s) == 0 or not isinstance(s[0], list) or not isinstance(s[1], float)
                   or any(not isinstance(t, int) or t < 0 for t in s[0]) for s in sequence_bias):
                raise ValueError("Each element in `sequence_bias` has to be a non-empty list of lists of positive "
                                 f"integers and float, but is {sequence_bias}.")
            sequence_bias = {tuple(ids): bias for ids, bias in sequence_bias}
        if not isinstance(sequence_bias, dict) or not sequence_bias:
            raise ValueError(f"`sequence_bias` has to be a non-empty dictionary, or non-empty list of lists but is "
                             f"{sequence_bias}.")
        for ids, bias in sequence_bias.items():
            if not isinstance(ids, tuple) or not ids or any(not isinstance(t, int) or t < 0 for t in ids):
                raise ValueError(f"Each key in `sequence_bias` has to be a non-empty tuple of positive integers, but "
                                 f"is {sequence_bias}.")
            if not isinstance(bias, float):
                raise ValueError(f"`sequence_bias` has to be a dict with floats as values, but is {sequence_bias}.")
        self.sequence_bias = sequence_bias

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        too_large = [t for ids in self.sequence_bias for t in ids if t >= vocab]
        if too_large:
            raise ValueError(f"The model vocabulary size is {vocab}, but the following tokens were being biased: "
                             f"{too_large}")
        bias = torch.zeros_like(scores, dtype=torch.float)
        for ids, value in self.sequence_bias.items():
            prefix = torch.tensor(ids[:-1], device=scores.device)
            if len(prefix) > input_ids.shape[1]:
                continue
            match = (input_ids[:, input_ids.shape[1] - len(prefix):] == prefix).all(dim=-1)
            bias[:, ids[-1]] += torch.where(match, value, 0.0)
        return scores + bias.to(scores.dtype)
