"""``LLM.beam_search`` (vLLM ``entrypoints/llm.py`` and ``vllm/beam_search.py``): beam search run over ``generate``.

vLLM's current beam search lives outside the engine. Each step asks the engine for one token of every live beam
with ``logprobs=2 * beam_width``; each beam's returned candidates extend it (cumulative logprob plus the token's);
a candidate that is the tokenizer's EOS (unless ``ignore_eos``) is set aside as completed, the others are ranked by
``get_beam_search_score`` and the best ``beam_width`` live on. After ``max_tokens`` steps (or when no beam is left)
the completed and live beams are ranked together and the best ``beam_width`` returned, their text the decoding of
prompt and generated tokens. The score is ``cum_logprob / len ** length_penalty`` with ``len`` counting the prompt
and not a final EOS (transformers' ``BeamHypotheses.add`` of the version vLLM cites).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from tqdm.auto import tqdm

from paged_serve.core.sequence import Logprob
from paged_serve.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class BeamSearchSequence:
    """One beam: prompt and generated ``tokens``, each generated step's logprobs dict, their running sum."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    lora_request: object | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


class BeamSearchInstance:
    """One prompt's search: its live ``beams`` (at first the prompt alone) and its ``completed`` ones."""

    def __init__(self, prompt_tokens: list[int], lora_request=None, logprobs=None, **kwargs):
        self.beams = [BeamSearchSequence(list(prompt_tokens), list(logprobs or []), lora_request, **kwargs)]
        self.completed: list[BeamSearchSequence] = []


def get_beam_search_score(tokens: list[int], cumulative_logprob: float, eos_token_id: int,
                          length_penalty: float = 1.0) -> float:  # fmt: skip
    seq_len = len(tokens) - (1 if tokens[-1] == eos_token_id else 0)
    return cumulative_logprob / (max(seq_len, 1) ** length_penalty)


def create_sort_beams_key_function(eos_token_id: int, length_penalty: float):
    return lambda beam: get_beam_search_score(beam.tokens, beam.cum_logprob, eos_token_id, length_penalty)


def _prompt_tokens(prompt, tokenizer) -> list[int]:
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    text = prompt["prompt"] if isinstance(prompt, dict) else prompt
    if not isinstance(text, str):
        raise TypeError(f"beam_search prompts are TextPrompt / TokensPrompt dicts or strings, got {prompt!r}")
    return tokenizer.encode(text)


def beam_search(llm, prompts: list, params: BeamSearchParams, use_tqdm: bool = False,
                concurrency_limit: int | None = None) -> list[BeamSearchOutput]:  # fmt: skip
    """The body of ``LLM.beam_search``: ``concurrency_limit`` prompts searched at a time (all by default)."""
    if params.beam_width < 1 or params.max_tokens < 1:
        raise ValueError(f"beam_width and max_tokens must be >= 1, got {params.beam_width}, {params.max_tokens}")
    tokenizer = llm.get_tokenizer()
    if tokenizer is None:
        raise ValueError("LLM.beam_search needs a tokenizer: the engine was built with skip_tokenizer_init=True")
    width, eos = params.beam_width, tokenizer.eos_token_id
    sort_key = create_sort_beams_key_function(eos, params.length_penalty)
    step_params = SamplingParams(logprobs=2 * width, max_tokens=1, temperature=params.temperature)
    if use_tqdm and concurrency_limit is not None:
        logger.warning("Progress bar is not supported when using concurrency_limit. Disabling progress bar.")
        use_tqdm = False
    instances = [BeamSearchInstance(_prompt_tokens(p, tokenizer)) for p in prompts]
    limit = concurrency_limit or max(len(instances), 1)
    for start in range(0, len(instances), limit):
        batch = instances[start : start + limit]
        for _ in tqdm(range(params.max_tokens), desc="Beam search", unit="token", disable=not use_tqdm):
            beams = [beam for instance in batch for beam in instance.beams]
            if not beams:
                break
            outputs = llm.generate([{"prompt_token_ids": b.tokens} for b in beams], step_params, use_tqdm=False)
            bounds = list(itertools.accumulate([0] + [len(instance.beams) for instance in batch]))
            for instance, lo, hi in zip(batch, bounds, bounds[1:]):
                live = []
                for beam, output in zip(beams[lo:hi], outputs[lo:hi]):
                    step = output.outputs[0].logprobs[0]
                    for token, lp in step.items():
                        new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step], beam.lora_request,
                                                 beam.cum_logprob + lp.logprob)  # fmt: skip
                        (instance.completed if token == eos and not params.ignore_eos else live).append(new)
                instance.beams = sorted(live, key=sort_key, reverse=True)[:width]
    results = []
    for instance in instances:
        best = sorted(instance.completed + instance.beams, key=sort_key, reverse=True)[:width]
        for beam in best:
            beam.text = tokenizer.decode(beam.tokens, skip_special_tokens=False)
        results.append(BeamSearchOutput(sequences=best))
    return results
