"""``InputProcessor`` (vLLM v1 ``engine/input_processor.py``): a request tokenized and checked before it is queued.

It touches no scheduler state, so a server can run it in any thread and refuse a bad request before it answers
anything. Beyond vLLM's checks (token ids in the vocabulary, ``max_logprobs``), a request with a sequence that
alone can never fit is refused here with the numbers that rule it out (``check_fits``); a group that only outgrows
the pool together is the scheduler's to preempt and, if it must, end (vLLM's ``test_swap_infeasible``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from paged_serve.config import CacheConfig, ModelConfig, SchedulerConfig
from paged_serve.inputs import PromptType, parse_prompt
from paged_serve.sampling_params import SamplingParams
from paged_serve.transformers_utils.tokenizer import Tokenizer


class ProcessedRequest(NamedTuple):
    """A tokenized, checked request, ready for ``LLMEngine.add_processed_request``."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


def eos_token_ids(model_dir: Path, hf_config: dict, tokenizer: Tokenizer | None) -> set[int]:
    """Every EOS id the checkpoint declares: config.json, the tokenizer, generation_config.json (may list several)."""
    ids: set[int] = set()
    sources = [hf_config.get("eos_token_id"), tokenizer.eos_token_id if tokenizer is not None else None]
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids |= {int(v) for v in value}
    return {i for i in ids if i >= 0}


def check_fits(params: SamplingParams, prompt_len: int, scheduler: SchedulerConfig, cache: CacheConfig) -> None:
    """Raise ``ValueError`` if the request can never run to its end.

    The sequences it can run at once (``max(n, best_of)``) must fit ``max_num_seqs``; and one sequence at full
    length must fit the pool below the watermark. The last sampled token needs no slot, so a sequence holds at
    most ``min(prompt + max_tokens - 1, max_model_len)`` tokens. The sequences of a group share the prompt's full
    blocks (copy-on-write); a group that outgrows the pool together is accepted, as vLLM does: the scheduler
    preempts it and, if it can no longer come back, ends it IGNORED (finish_reason ``length``).
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
    if per_seq > usable:
        raise ValueError(
            f"a sequence of up to {tokens} tokens needs {per_seq} KV blocks ({cache.block_size} per block) but "
            f"the cache has {usable}: lower max_tokens / max_model_len or give the cache more blocks"
        )


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, eos_ids: set[int], model: ModelConfig,
                 scheduler: SchedulerConfig, cache: CacheConfig):  # fmt: skip
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self.model_config, self.scheduler_config, self.cache_config = model, scheduler, cache

    def process(
        self, prompt: PromptType | None, params: SamplingParams | None, prompt_token_ids: list[int] | None = None
    ) -> ProcessedRequest:
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        text, ids = parse_prompt(prompt if prompt is not None else {"prompt_token_ids": list(prompt_token_ids)})
        params = (params or SamplingParams()).clone()
        if self.tokenizer is None:
            if ids is None:
                raise ValueError("prompts must be None if skip_tokenizer_init is True (give token ids: a TokensPrompt)")
            if params.stop:
                raise ValueError("skip_tokenizer_init=True: stop strings need a tokenizer (use stop_token_ids)")
            params.detokenize = False
        if ids is None:
            ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError("the prompt is empty (no tokens)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        max_logprobs = self.model_config.max_logprobs
        if params.logprobs is not None and params.logprobs > max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} exceeds max_logprobs={max_logprobs}")
        if params.prompt_logprobs is not None:
            if params.prompt_logprobs > max_logprobs:
                raise ValueError(f"prompt_logprobs={params.prompt_logprobs} exceeds max_logprobs={max_logprobs}")
            if self.cache_config.enable_prefix_caching:
                raise ValueError("prompt_logprobs needs every prompt token computed: not with enable_prefix_caching")
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise ValueError(f"logit_bias token id {max(params.logit_bias)} is outside [0, {self.vocab_size})")
        check_fits(params, len(ids), self.scheduler_config, self.cache_config)
        params.update_from_generation_config(self.eos_ids)
        return ProcessedRequest(text, ids, params)
