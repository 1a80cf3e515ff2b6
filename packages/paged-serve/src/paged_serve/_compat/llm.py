"""``LLM`` (vLLM ``entrypoints/llm.py``): offline batched generation over ``LLMEngine``.

``LLM(model_dir, **engine_args).generate(prompts, sampling_params)`` queues every prompt, steps the engine until
all are done (continuous batching does the rest) and returns one ``RequestOutput`` per prompt, in prompt order.
The prompts come in any of vLLM's forms: one ``PromptType`` or a list of them, a bare list of token ids, or the
older ``prompt_token_ids=`` list of id lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from paged_serve._compat.arg_utils import EngineArgs
from paged_serve.engine.llm_engine import LLMEngine
from paged_serve.engine.metrics import Stats
from paged_serve.inputs import PROMPT_FORMS, PromptType, is_token_ids, parse_prompt
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import RequestOutputKind, SamplingParams


def parse_prompts(prompts, prompt_token_ids: Sequence[Sequence[int]] | None = None) -> list[tuple]:
    """Every prompt ``LLM.generate`` was given, in order; a bare list of ints is one tokens prompt."""
    if (prompts is None) == (prompt_token_ids is None):
        raise ValueError("give exactly one of prompts and prompt_token_ids")
    if prompt_token_ids is not None:
        if is_token_ids(prompt_token_ids):
            prompt_token_ids = [prompt_token_ids]
        return [parse_prompt({"prompt_token_ids": list(ids)}) for ids in prompt_token_ids]
    if isinstance(prompts, (str, dict)):
        return [parse_prompt(prompts)]
    if is_token_ids(prompts) and prompts:
        return [parse_prompt({"prompt_token_ids": prompts})]
    if isinstance(prompts, (list, tuple)):
        return [parse_prompt({"prompt_token_ids": p}) if is_token_ids(p) and p else parse_prompt(p) for p in prompts]
    raise TypeError(f"prompts must be a PromptType or a list of them ({PROMPT_FORMS}), got {type(prompts).__name__}")


class LLM:
    def __init__(self, model: str, **kwargs):
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, **kwargs))
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for vLLM's prompt forms (a string, ``TextPrompt``, ``TokensPrompt``, or a list of them), or for
        ``prompt_token_ids`` (one list of ids per prompt, vLLM's older argument)."""
        items = parse_prompts(prompts, prompt_token_ids)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(items)
        if len(sampling_params) != len(items):
            raise ValueError(f"{len(sampling_params)} sampling_params for {len(items)} prompts")
        engine = self.llm_engine
        processed = []  # every request checked before any is queued: a bad one leaves the engine untouched
        for (text, token_ids), params in zip(items, sampling_params):
            params = params.clone()
            params.output_kind = RequestOutputKind.FINAL_ONLY
            processed.append(engine.process_request(text, params, token_ids))
        ids = []
        for request in processed:
            rid = str(next(self._counter))
            engine.add_processed_request(rid, request)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm, unit="req") as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        results[output.request_id] = output
                        bar.update(1)
        return [results[rid] for rid in ids]

    def get_stats(self) -> Stats:
        return self.llm_engine.get_stats()
