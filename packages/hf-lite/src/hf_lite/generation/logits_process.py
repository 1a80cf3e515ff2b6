"""Logits processors and warpers (transformers' ``generation/logits_process.py``).

Each maps ``(input_ids, scores)`` to new scores for the next token. ``GenerationMixin`` builds them in transformers'
order: repetition penalty, no-repeat-ngram, bad words, min length, min new tokens, inf/nan removal, suppress tokens,
then (sampling only) temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import torch


class LogitsProcessor:
    """Base class: ``__call__(input_ids (batch, seq), scores (batch, vocab)) -> scores``."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        raise TypeError(f"{type(self).__name__} is abstract; subclasses implement __call__")


class LogitsProcessorList(list):
    """Applies its processors in order."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.FloatTensor:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


def _eos_tensor(eos_token_id, device="cpu") -> torch.Tensor:
    if isinstance(eos_token_id, torch.Tensor):
        return eos_token_id.reshape(-1)
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    if not eos_token_id or any(not isinstance(i, int) or i < 0 for i in eos_token_id):
        raise ValueError(f"`eos_token_id` has to be a list of non-negative integers, but is {eos_token_id!r}")
    return torch.tensor(eos_token_id, device=device)


def _mask_tokens(scores: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    return torch.where(torch.isin(vocab, token_ids.to(scores.device)), -float("inf"), scores)


class MinLengthLogitsProcessor(LogitsProcessor):
    """Forbid EOS while the whole sequence (prompt included) is shorter than ``min_length``."""

    def __init__(self, min_length: int, eos_token_id, device: str = "cpu"):
        if not isinstance(min_length, int) or min_length < 0:
            raise ValueError(f"`min_length` has to be a non-negative integer, but is {min_length!r}")
        self.min_length = min_length
        self.eos_token_id = _eos_tensor(eos_token_id, device)

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] < self.min_length:
            return _mask_tokens(scores, self.eos_token_id)
        return scores.clone()


class MinNewTokensLengthLogitsProcessor(LogitsProcessor):
    """Forbid EOS until ``min_new_tokens`` tokens were generated after the prompt."""

    def __init__(self, prompt_length_to_skip: int, min_new_tokens: int, eos_token_id, device: str = "cpu"):
        for name, value in (("prompt_length_to_skip", prompt_length_to_skip), ("min_new_tokens", min_new_tokens)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` has to be a positive integer, but is {value!r}")
        self.prompt_length_to_skip = prompt_length_to_skip
        self.min_new_tokens = min_new_tokens
        self.eos_token_id = _eos_tensor(eos_token_id, device)

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] - self.prompt_length_to_skip < self.min_new_tokens:
            return _mask_tokens(scores, self.eos_token_id)
        return scores.clone()


class TemperatureLogitsWarper(LogitsProcessor):
    """Divide logits by the temperature (softer < 1 < sharper)."""

    def __init__(self, temperature: float):
        if not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"`temperature` (={temperature!r}) has to be a strictly positive float")
        self.temperature = temperature

    def __call__(self, input_ids, scores):
        return scores / self.temperature


class RepetitionPenaltyLogitsProcessor(LogitsProcessor):
    """CTRL's penalty (Keskar et al. 2019, sec. 4.1): seen tokens' logits divided (if > 0) or multiplied by it.

    ``prompt_ignore_length`` (int or per-row tensor) excludes the first tokens, e.g. left padding.
    """

    def __init__(self, penalty: float, prompt_ignore_length: int | torch.Tensor | None = None):
        if not isinstance(penalty, (int, float)) or not penalty > 0:
            raise ValueError(f"`penalty` has to be a strictly positive float, but is {penalty!r}")
        self.penalty = penalty
        self.prompt_ignore_length = prompt_ignore_length

    def __call__(self, input_ids, scores):
        vocab_size = scores.shape[-1]
        ignore = self.prompt_ignore_length
        if isinstance(ignore, int):
            input_ids = input_ids[:, ignore:]
        elif isinstance(ignore, torch.Tensor):
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            input_ids = input_ids.masked_fill(positions[None, :] < ignore.to(input_ids.device)[:, None], vocab_size)
        # An extra column absorbs ignored ids (and ids beyond the head's vocab).
        padded = torch.nn.functional.pad(scores, (0, 1))
        input_ids = input_ids.clamp(max=vocab_size)
        seen = torch.gather(padded, 1, input_ids)
        seen = torch.where(seen < 0, seen * self.penalty, seen / self.penalty)
        return padded.scatter(1, input_ids, seen)[:, :vocab_size]


class TopKLogitsWarper(LogitsProcessor):
    """Keep the ``top_k`` highest logits (ties with the k-th are kept)."""

    def __init__(self, top_k: int, filter_value: float = -float("inf"), min_tokens_to_keep: int = 1):
        if not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"`top_k` has to be a strictly positive integer, but is {top_k!r}")
        self.top_k = max(top_k, min_tokens_to_keep)
        self.filter_value = filter_value

    def __call__(self, input_ids, scores):
        k = min(self.top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        return scores.masked_fill(scores < kth, self.filter_value)


class TopPLogitsWarper(LogitsProcessor):
    """Nucleus sampling (Holtzman et al. 2019): keep the smallest set whose probability mass reaches ``top_p``."""

    def __init__(self, top_p: float, filter_value: float = -float("inf"), min_tokens_to_keep: int = 1):
        top_p = float(top_p)
        if not 0 <= top_p <= 1.0:
            raise ValueError(f"`top_p` has to be a float > 0 and < 1, but is {top_p}")
        if not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
            raise ValueError(f"`min_tokens_to_keep` has to be a positive integer, but is {min_tokens_to_keep!r}")
        self.top_p, self.filter_value, self.min_tokens_to_keep = top_p, filter_value, min_tokens_to_keep

    def __call__(self, input_ids, scores):
        # Ascending sort: drop the low tail whose cumulative mass stays within 1 - top_p.
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - self.top_p)
        remove_sorted[..., -self.min_tokens_to_keep :] = False
        remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
        return scores.masked_fill(remove, self.filter_value)


class MinPLogitsWarper(LogitsProcessor):
    """Min-p sampling (Nguyen et al. 2024): drop tokens with probability below ``min_p`` x the top probability."""

    def __init__(self, min_p: float, filter_value: float = -float("inf"), min_tokens_to_keep: int = 1):
        if not 0 <= min_p <= 1.0:
            raise ValueError(f"`min_p` has to be a float in the [0, 1] interval, but is {min_p}")
        if not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
            raise ValueError(f"`min_tokens_to_keep` has to be a positive integer, but is {min_tokens_to_keep!r}")
        self.min_p, self.filter_value, self.min_tokens_to_keep = min_p, filter_value, min_tokens_to_keep

    def __call__(self, input_ids, scores):
        probs = torch.softmax(scores, dim=-1)
        remove = probs < self.min_p * probs.amax(dim=-1, keepdim=True)
        keep = torch.topk(probs, min(self.min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
        remove = remove.scatter(-1, keep, False)
        return scores.masked_fill(remove, self.filter_value)


class NoRepeatNGramLogitsProcessor(LogitsProcessor):
    """Ban any token that would complete an n-gram already present in the row (Paulus et al. 2017)."""

    def __init__(self, ngram_size: int):
        if not isinstance(ngram_size, int) or ngram_size <= 0:
            raise ValueError(f"`ngram_size` has to be a strictly positive integer, but is {ngram_size!r}")
        self.ngram_size = ngram_size

    def __call__(self, input_ids, scores):
        n, cur_len = self.ngram_size, input_ids.shape[-1]
        if cur_len + 1 < n:
            return scores
        scores = scores.clone()
        prefix_len = n - 1
        for row in range(input_ids.shape[0]):
            tokens = input_ids[row].tolist()
            prefix = tuple(tokens[cur_len - prefix_len :]) if prefix_len else ()
            banned = {
                tokens[i + prefix_len] for i in range(cur_len - n + 1) if tuple(tokens[i : i + prefix_len]) == prefix
            }
            banned = [t for t in banned if t < scores.shape[-1]]
            if banned:
                scores[row, banned] = -float("inf")
        return scores


class InfNanRemoveLogitsProcessor(LogitsProcessor):
    """NaN -> 0 and +-inf -> the dtype's extremes, so sampling never sees them (``remove_invalid_values``)."""

    def __call__(self, input_ids, scores):
        scores = torch.where(scores != scores, torch.zeros_like(scores), scores)
        finfo = torch.finfo(scores.dtype)
        scores = torch.where(scores == float("inf"), torch.full_like(scores, finfo.max), scores)
        return torch.where(scores == -float("inf"), torch.full_like(scores, finfo.min), scores)


class SuppressTokensLogitsProcessor(LogitsProcessor):
    """Never generate the listed tokens."""

    def __init__(self, suppress_tokens, device: str = "cpu"):
        self.suppress_tokens = torch.tensor(list(suppress_tokens), device=device, dtype=torch.long)

    def __call__(self, input_ids, scores):
        return _mask_tokens(scores, self.suppress_tokens)


class NoBadWordsLogitsProcessor(LogitsProcessor):
    """Forbid token sequences: a one-token entry is always banned; a longer one is banned as its last token when the
    row ends with the entry's prefix. EOS entries are ignored (like transformers) so generation can still stop."""

    def __init__(self, bad_words_ids: list[list[int]], eos_token_id=None):
        if not isinstance(bad_words_ids, list) or not bad_words_ids:
            raise ValueError(f"`bad_words_ids` has to be a non-empty list, but is {bad_words_ids!r}")
        for seq in bad_words_ids:
            if not isinstance(seq, list) or not seq or any(not isinstance(t, int) or t < 0 for t in seq):
                raise ValueError(f"Each list in `bad_words_ids` has to be a list of positive integers, got {seq!r}")
        eos = [] if eos_token_id is None else _eos_tensor(eos_token_id).tolist()
        self.bad_words_ids = [seq for seq in bad_words_ids if seq not in [[e] for e in eos]]

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        rows = input_ids.tolist()
        for seq in self.bad_words_ids:
            *prefix, last = seq
            if last >= scores.shape[-1]:
                continue
            for r, tokens in enumerate(rows):
                if not prefix or (len(tokens) >= len(prefix) and tokens[len(tokens) - len(prefix) :] == prefix):
                    scores[r, last] = -float("inf")
        return scores
