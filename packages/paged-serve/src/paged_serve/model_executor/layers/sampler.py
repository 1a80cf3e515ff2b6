"""``Sampler`` (vLLM ``model_executor/layers/sampler.py``): logits of the sampled rows -> next tokens and logprobs.

Per row, in vLLM's order: min_tokens (stop tokens masked until reached), logit_bias, repetition penalty over prompt
and output tokens (divide positive logits, multiply negative ones: CTRL, arXiv:1909.05858), frequency and presence
penalties over output tokens (OpenAI's), temperature, top-k, top-p, min-p; then greedy argmax at temperature 0, or
an exponential race ``argmax(p / q), q ~ Exp(1)`` (a categorical sample) drawn from the request's own generator when
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
        """min_tokens masking, logit_bias (OpenAI's: added to the logits) and penalties, in fp32 (shared by
        sampling and beam search)."""
        logits = logits.float()
        for i, r in enumerate(rows):
            if len(r.output_token_ids) < r.params.min_tokens:
                stop = [t for t in r.params.all_stop_token_ids if t < logits.shape[1]]
                logits[i, stop] = float("-inf")
            if r.params.logit_bias:
                ids = torch.tensor(list(r.params.logit_bias), dtype=torch.long, device=logits.device)
                logits[i, ids] += torch.tensor(list(r.params.logit_bias.values()), device=logits.device)
        if any(
            r.params.repetition_penalty != 1.0 or r.params.frequency_penalty or r.params.presence_penalty for r in rows
        ):
            logits = _penalties(logits, rows)
        return logits

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampleResult]:
        device = logits.device
        raw_logprobs = logits.float().log_softmax(dim=-1)
        logits = self.process_logits(logits, rows)
        greedy = [r.params.temperature < 1e-5 for r in rows]
        # one row per sample: a request's first sample may draw best_of tokens from the same distribution
        owner = torch.tensor([i for i, r in enumerate(rows) for _ in range(r.num_samples)], device=device)
        tokens = torch.empty(len(owner), dtype=torch.long, device=device)
        is_greedy = torch.tensor([greedy[i] for i in owner.tolist()], dtype=torch.bool, device=device)
        if is_greedy.any():
            tokens[is_greedy] = logits[owner[is_greedy]].argmax(dim=-1)
        if not is_greedy.all():
            random_rows = [i for i, g in enumerate(greedy) if not g]
            sub = [rows[i] for i in random_rows]
            temperature = torch.tensor([r.params.temperature for r in sub], device=device)
            probs = _top_k_top_p_min_p(logits[random_rows] / temperature[:, None], sub).softmax(dim=-1)
            q = torch.empty((int((~is_greedy).sum()), probs.shape[1]), device=device)
            picks, unseeded, slot = [], [], 0
            for k, r in enumerate(sub):
                span = slice(slot, slot + r.num_samples)
                if r.generator is None:
                    unseeded += range(slot, slot + r.num_samples)
                else:  # a seeded request draws from its own generator alone
                    q[span] = torch.empty((r.num_samples, q.shape[1]), device=device).exponential_(
                        generator=r.generator
                    )
                picks += [k] * r.num_samples
                slot += r.num_samples
            if unseeded:  # one draw for every request without a seed
                q[unseeded] = torch.empty((len(unseeded), q.shape[1]), device=device).exponential_(
                    generator=self.generator
                )
            sampled = (probs[picks] / q).argmax(dim=-1)
            tokens[~is_greedy] = sampled
        chosen = raw_logprobs[owner, tokens]
        asked = torch.tensor([rows[i].params.logprobs is not None for i in owner.tolist()], device=device)
        ranks = torch.zeros_like(tokens)
        if asked.any():  # a rank costs a pass over the vocabulary: only for requests that return logprobs
            ranks[asked] = (raw_logprobs[owner[asked]] > chosen[asked, None]).sum(dim=-1) + 1
        want_top = max((r.params.logprobs or 0) for r in rows)
        top = raw_logprobs.topk(min(want_top, raw_logprobs.shape[1])) if want_top else None
        tokens_l, chosen_l, ranks_l, owner_l = tokens.tolist(), chosen.tolist(), ranks.tolist(), owner.tolist()
        results = [SampleResult([], []) for _ in rows]
        for t, lp, rank, i in zip(tokens_l, chosen_l, ranks_l, owner_l):
            entry = {t: Logprob(lp, rank or None)}
            k = rows[i].params.logprobs
            if k:
                values, indices = top.values[i, :k].tolist(), top.indices[i, :k].tolist()
                for r, (v, tok) in enumerate(zip(values, indices), start=1):
                    entry.setdefault(tok, Logprob(v, r))
            results[i].token_ids.append(t)
            results[i].logprobs.append(entry)
        return results
