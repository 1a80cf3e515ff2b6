"""``Sampler`` (vLLM ``model_executor/layers/sampler.py``): logits of the sampled rows -> next tokens and logprobs.

Per row, in vLLM's order: min_tokens (stop tokens masked until reached), repetition penalty over prompt and output
tokens (divide positive logits, multiply negative ones: CTRL, arXiv:1909.05858), frequency and presence penalties
over output tokens (OpenAI's), temperature, top-k, top-p, min-p; then greedy argmax at temperature 0, or an
exponential race ``argmax(p / q), q ~ Exp(1)`` (a categorical sample) drawn from the request's own generator when
it has a seed, so a seeded request samples the same tokens whatever else is in the batch. Logprobs are the model's
raw ones (vLLM v1's default), with the sampled token's rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_serve.core.sequence import Logprob
from paged_serve.sampling_params import SamplingParams


@dataclass
class SampleRow:
    """One row of logits to sample from, and what the sampler needs to know about its sequence."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None
    num_samples: int = 1  # a request's first sample draws best_of tokens (parallel sampling forks on them)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]


def _penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    vocab = logits.shape[1]
    rep = torch.tensor([r.params.repetition_penalty for r in rows], device=logits.device)
    freq = torch.tensor([r.params.frequency_penalty for r in rows], device=logits.device)
    pres = torch.tensor([r.params.presence_penalty for r in rows], device=logits.device)
    counts = torch.zeros_like(logits)
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    for i, r in enumerate(rows):
        out = torch.tensor([t for t in r.output_token_ids if t < vocab], dtype=torch.long, device=logits.device)
        counts[i].index_add_(0, out, torch.ones(len(out), device=logits.device))
        prompt = torch.tensor([t for t in r.prompt_token_ids if t < vocab], dtype=torch.long, device=logits.device)
        seen[i, prompt] = True
    seen |= counts > 0
    penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
    logits = torch.where(seen, penalised, logits)
    return logits - freq[:, None] * counts - pres[:, None] * (counts > 0)


def _top_k_top_p_min_p(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    top_k = [r.params.top_k for r in rows]
    if any(k != -1 for k in top_k):
        k = torch.tensor([logits.shape[1] if v == -1 else min(v, logits.shape[1]) for v in top_k], device=logits.device)
        kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = torch.tensor([r.params.top_p for r in rows], device=logits.device)
    if (top_p < 1.0).any():
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - top_p)[:, None]
        drop[:, -1] = False  # always keep the most likely token
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    min_p = torch.tensor([r.params.min_p for r in rows], device=logits.device)
    if (min_p > 0).any():
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    return logits


class Sampler:
    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator  # draws of requests without a seed

    def process_logits(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """min_tokens masking and penalties, in fp32 (shared by sampling and beam search)."""
        logits = logits.float()
        for i, r in enumerate(rows):
            if len(r.output_token_ids) < r.params.min_tokens:
                stop = [t for t in r.params.all_stop_token_ids if t < logits.shape[1]]
                logits[i, stop] = float("-inf")
        if any(
            r.params.repetition_penalty != 1.0 or r.params.frequency_penalty or r.params.presence_penalty for r in rows
        ):
            logits = _penalties(logits, rows)
        return logits

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampleResult]:
        raw_logprobs = logits.float().log_softmax(dim=-1)
        logits = self.process_logits(logits, rows)
        greedy = torch.tensor([r.params.temperature < 1e-5 for r in rows], device=logits.device)
        temperature = torch.tensor([1.0 if g else r.params.temperature for r, g in zip(rows, greedy)])
        logits = _top_k_top_p_min_p(logits / temperature.to(logits.device)[:, None], rows)
        probs = logits.softmax(dim=-1)
        results = []
        for i, row in enumerate(rows):
            if greedy[i]:
                tokens = [int(logits[i].argmax())] * row.num_samples
            else:
                q = torch.empty((row.num_samples, probs.shape[1]), device=probs.device)
                q.exponential_(generator=row.generator or self.generator)
                tokens = (probs[i][None, :] / q).argmax(dim=-1).tolist()
            results.append(SampleResult(tokens, [self._logprobs(raw_logprobs[i], t, row.params) for t in tokens]))
        return results

    @staticmethod
    def _logprobs(logprobs: torch.Tensor, token: int, params: SamplingParams) -> dict[int, Logprob]:
        """The sampled token's logprob (always: the cumulative logprob needs it), plus the top ``logprobs``."""
        value = logprobs[token]
        rank = int((logprobs > value).sum()) + 1
        out = {token: Logprob(float(value), rank)}
        if params.logprobs:
            top = logprobs.topk(min(params.logprobs, logprobs.shape[0]))
            for r, (v, t) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
                out.setdefault(int(t), Logprob(v, r))
        return out
