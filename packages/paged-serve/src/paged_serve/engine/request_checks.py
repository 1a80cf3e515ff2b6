"""What a request must satisfy before it is queued: a request the engine could never finish is refused up front.

vLLM v0 finds such requests only in the scheduler (IGNORED, or a queue blocked behind them); here they fail at
``add_request`` with the numbers that rule them out, so a server answers 400 instead of a cut-short 200.
"""

from __future__ import annotations

from typing import NamedTuple

from paged_serve.config import CacheConfig, SchedulerConfig
from paged_serve.sampling_params import SamplingParams


class ProcessedRequest(NamedTuple):
    """A tokenized, checked request, ready for ``LLMEngine.add_processed_request``."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


def check_fits(params: SamplingParams, prompt_len: int, scheduler: SchedulerConfig, cache: CacheConfig) -> None:
    """Raise ``ValueError`` if the request can never run to its end.

    The sequences it can run at once (``max(n, best_of)``) must fit ``max_num_seqs``; and, counted without any
    block sharing (a recomputed fork re-allocates each sequence from its own tokens), their KV blocks at full
    length must fit the pool below the watermark. The last sampled token needs no slot, so a sequence holds at
    most ``min(prompt + max_tokens - 1, max_model_len)`` tokens.
    """
    num_seqs = max(params.n, params.best_of or params.n)
    if num_seqs > scheduler.max_num_seqs:
        raise ValueError(
            f"n={params.n}, best_of={params.best_of}: the request runs {num_seqs} sequences at once, more than "
            f"max_num_seqs={scheduler.max_num_seqs}"
        )
    if prompt_len > scheduler.max_model_len:
        return  # the scheduler ignores it with its reason (vLLM's behaviour for too-long prompts)
    max_new = params.max_tokens if params.max_tokens is not None else scheduler.max_model_len
    tokens = min(prompt_len + max_new - 1, scheduler.max_model_len)
    per_seq = -(-tokens // cache.block_size)
    usable = cache.num_gpu_blocks - int(cache.watermark * cache.num_gpu_blocks)
    if num_seqs * per_seq > usable:
        raise ValueError(
            f"the request needs up to {num_seqs} x {per_seq} = {num_seqs * per_seq} KV blocks ({num_seqs} "
            f"sequence(s) of up to {tokens} tokens, {cache.block_size} per block) but the cache has {usable}: "
            "lower n / best_of / max_tokens or give the cache more blocks"
        )
