"""``LLM`` (vLLM ``entrypoints/llm.py``): offline batched generation over ``LLMEngine``.

``LLM(model_dir, **engine_args).generate(prompts, sampling_params)`` queues every prompt, steps the engine until
all are done (continuous batching does the rest) and returns one ``RequestOutput`` per prompt, in prompt order.
The prompts come in any of vLLM's forms: one ``PromptType`` or a list of them, a bare list of token ids, or the
older ``prompt_token_ids=`` list of id lists. ``chat`` renders conversations through the chat template
(``chat_utils.py``) and generates from them; without sampling parameters both use
``get_default_sampling_params()``: vLLM's defaults with the model's generation_config.json over them. The rest of
vLLM's public methods keep its signatures: implemented where the engine has the mechanism (``llm_extras.py``),
else refused with vLLM's error (the pooling API on a generative model) or naming what is missing.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm

from paged_serve._compat.arg_utils import EngineArgs
from paged_serve._compat.beam_search_offline import BeamSearchOutput, beam_search
from paged_serve._compat.chat_utils import (
    apply_hf_chat_template,
    parse_chat_messages,
    resolve_chat_template_content_format,
)
from paged_serve._compat.llm_extras import (
    POOLING_TASK_REQUIRED,
    PROFILER_OFF,
    Metric,
    check_priority,
    collective_rpc,
    reset_prefix_cache,
    snapshot_metrics,
    tokenize_prompts,
)
from paged_serve._compat.openai.cli_args import VLLM_ONLY_FLAGS, check_vllm_only_kwargs
from paged_serve.engine.llm_engine import LLMEngine
from paged_serve.engine.metrics import Stats
from paged_serve.inputs import PROMPT_FORMS, PromptType, TextPrompt, TokensPrompt, is_token_ids, parse_prompt
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


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


def _no_lora(lora_request) -> None:
    if lora_request is not None:
        raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled!")  # vLLM's InputProcessor


def _pooling_only(method: str) -> ValueError:
    """vLLM's refusal of a pooling method on a generative model (paged_serve runs generative models only)."""
    return ValueError(
        f"LLM.{method}() is only supported for pooling models. Try passing `--runner pooling` to use the model as a "
        "pooling model."
    )


class LLM:
    """vLLM's offline entry point (``vllm.LLM``); ``**kwargs`` are ``EngineArgs``' (vLLM's names), and vLLM's
    arguments paged_serve has no mechanism for are noted or refused by name (``_compat/openai/cli_args.py``)."""

    def __init__(self, model: str, **kwargs):
        self.log_stats = kwargs.get("disable_log_stats", True) is False  # LLM logs no stats unless asked, as vLLM
        kwargs = check_vllm_only_kwargs(kwargs)  # vLLM's enforce_eager=, quantization=, ...: noted or refused
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, **kwargs))
        self.model_config = self.llm_engine.model_config
        self.supported_tasks: tuple[str, ...] = ("generate",)
        self._counter = itertools.count()
        self.default_sampling_params: dict[str, Any] | None = None

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_world_size(self, include_dp: bool = True) -> int:
        """Ranks the model runs on: the tensor-parallel size (no pipeline or data parallelism here)."""
        return self.llm_engine.parallel_config.world_size

    def reset_mm_cache(self) -> None:
        """vLLM clears its multimodal processor cache; text-only models keep none."""

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget every cached prefix block (vLLM ``LLM.reset_prefix_cache``): True once done; False, as vLLM's
        block pool answers, while requests still hold blocks (this engine cannot preempt them for it)."""
        return reset_prefix_cache(self.llm_engine, reset_running_requests)

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        """Run ``method`` (a ``Worker`` method name, or a function taking the worker first) on every rank."""
        return collective_rpc(self.llm_engine, method, args, kwargs or {})

    def apply_model(self, func) -> list:
        """``func(model)`` on every rank's model; one result per rank."""
        return self.collective_rpc(lambda worker: func(worker.model))

    def start_profile(self) -> None:
        raise RuntimeError(PROFILER_OFF)

    def stop_profile(self) -> None:
        raise RuntimeError(PROFILER_OFF)

    def sleep(self, level: int = 1) -> None:
        raise ValueError(f"LLM.sleep(level={level}) is not supported: {VLLM_ONLY_FLAGS['--enable-sleep-mode'][2]}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise ValueError(f"LLM.wake_up() is not supported: {VLLM_ONLY_FLAGS['--enable-sleep-mode'][2]}")

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges under vLLM's metric names (vLLM ``v1/metrics/reader.py``)."""
        if not self.log_stats:
            raise AssertionError("Stat logging disabled")  # vLLM's LLMEngine.get_metrics, as LLM defaults
        return snapshot_metrics(self.llm_engine.get_stats(), {"model_name": self.model_config.model, "engine": "0"})

    def init_weight_transfer_engine(self, request) -> None:
        raise NotImplementedError("weight transfer for RL training is not supported: paged_serve loads checkpoints")

    def update_weights(self, request) -> None:
        raise NotImplementedError("weight transfer for RL training is not supported: paged_serve loads checkpoints")

    def __repr__(self) -> str:
        """The model's module tree (the driver rank's shard under tensor parallelism), as vLLM's ``LLM`` prints."""
        return repr(self.llm_engine.model)

    # vLLM's pooling-model API: refused for a generative model with vLLM's errors, in vLLM's order
    def encode(self, prompts=None, pooling_params=None, *, truncate_prompt_tokens: int | None = None,
               use_tqdm: bool = True, lora_request=None, pooling_task=None, tokenization_kwargs=None):  # fmt: skip
        if pooling_task is None:
            raise ValueError(POOLING_TASK_REQUIRED)
        raise _pooling_only("encode")

    def embed(self, prompts, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
              pooling_params=None, lora_request=None, tokenization_kwargs=None):  # fmt: skip
        raise ValueError(
            "Embedding API is not supported by this model. Try converting the model using `--convert embed`."
        )

    def classify(self, prompts, *, pooling_params=None, use_tqdm: bool = True, lora_request=None,
                 tokenization_kwargs=None):  # fmt: skip
        raise ValueError(
            "Classification API is not supported by this model. Try converting the model using `--convert classify`."
        )

    def reward(self, prompts, /, *, pooling_params=None, truncate_prompt_tokens: int | None = None,
               use_tqdm: bool = True, lora_request=None, tokenization_kwargs=None):  # fmt: skip
        return self.encode(prompts, pooling_params, pooling_task="token_classify")

    def score(self, data_1, data_2, /, *, use_tqdm: bool = True, pooling_params=None, lora_request=None,
              tokenization_kwargs=None, chat_template: str | None = None):  # fmt: skip
        raise _pooling_only("score")

    def set_tokenizer(self, tokenizer) -> None:
        """Use ``tokenizer`` (paged_serve's or a transformers one) for prompts and output text from now on."""
        engine = self.llm_engine
        engine.tokenizer = engine.input_processor.tokenizer = engine.output_processor.tokenizer = tokenizer

    def beam_search(
        self,
        prompts: list[TokensPrompt | TextPrompt],
        params: BeamSearchParams,
        lora_request=None,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: the best ``params.beam_width`` continuations of each prompt
        (``beam_search_offline.py``)."""
        _no_lora(lora_request)
        return beam_search(self, prompts, params, use_tqdm, concurrency_limit)

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's ``SamplingParams()`` with what the model's generation config sets over it
        (``ModelConfig.get_diff_sampling_param``; ``generation_config="vllm"`` leaves vLLM's defaults)."""
        if self.default_sampling_params is None:
            self.default_sampling_params = self.llm_engine.model_config.get_diff_sampling_param()
        return SamplingParams(**self.default_sampling_params)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        *,
        lora_request=None,
        priority: list[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate for vLLM's prompt forms (a string, ``TextPrompt``, ``TokensPrompt``, or a list of them), or for
        ``prompt_token_ids`` (one list of ids per prompt, vLLM's older argument). ``tokenization_kwargs``:
        ``add_special_tokens`` and ``truncate_prompt_tokens`` (keep the last k ids; -1: ``max_model_len``);
        ``priority`` needs a priority scheduler, which paged_serve does not have (all 0, or vLLM's error)."""
        _no_lora(lora_request)
        items = parse_prompts(prompts, prompt_token_ids)
        check_priority(priority, len(items))
        if tokenization_kwargs:
            items = tokenize_prompts(self.get_tokenizer(), items, tokenization_kwargs, self.max_model_len)
        return self._run(items, sampling_params, use_tqdm)

    @property
    def max_model_len(self) -> int:
        return self.llm_engine.scheduler_config.max_model_len

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request=None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}`` messages) or to a list of them:
        each is rendered by the chat template (the model's, or ``chat_template``) and tokenized without adding
        special tokens (the template has them), then generated as ``generate`` does (vLLM ``LLM.chat``)."""
        _no_lora(lora_request)
        if mm_processor_kwargs is not None:
            logger.warning("mm_processor_kwargs ignored: paged_serve runs text-only models")
        conversations = messages if messages and all(isinstance(m, list) for m in messages) else [messages]
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("LLM.chat needs a tokenizer: the engine was built with skip_tokenizer_init=True")
        content_format = resolve_chat_template_content_format(
            chat_template, tools, chat_template_content_format, tokenizer
        )
        items = []
        for conversation in conversations:
            prompt = apply_hf_chat_template(
                tokenizer,
                parse_chat_messages(conversation, content_format),
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                **(chat_template_kwargs or {}),
            )
            items.append((prompt, tokenizer.encode(prompt, add_special_tokens=False)))
        if tokenization_kwargs:  # the template's text, tokenized again under the caller's options
            kwargs = {"add_special_tokens": False, **tokenization_kwargs}
            items = tokenize_prompts(tokenizer, [(text, None) for text, _ in items], kwargs, self.max_model_len)
        return self._run(items, sampling_params, use_tqdm)

    def _run(self, items: list[tuple], sampling_params, use_tqdm) -> list[RequestOutput]:
        """Queue every (text, token ids) prompt, step the engine until all are done, outputs in prompt order."""
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(items)
        if len(sampling_params) != len(items):
            raise ValueError(f"{len(sampling_params)} sampling_params for {len(items)} prompts")
        engine = self.llm_engine
        processed = []  # every request checked before any is queued: a bad one leaves the engine untouched
        for (text, token_ids), params in zip(items, sampling_params):
            params = params.clone()
            params.output_kind = RequestOutputKind.FINAL_ONLY
            if text is not None and token_ids is not None:  # a rendered chat: its ids, its text in the output
                processed.append(engine.process_request(None, params, token_ids)._replace(prompt=text))
            else:
                processed.append(engine.process_request(text, params, token_ids))
        ids = []
        for request in processed:
            rid = str(next(self._counter))
            engine.add_processed_request(rid, request)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        make_bar = use_tqdm if callable(use_tqdm) else tqdm  # vLLM takes a tqdm factory too
        with make_bar(total=len(ids), desc="Processed prompts", disable=not use_tqdm, unit="req") as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        results[output.request_id] = output
                        bar.update(1)
        return [results[rid] for rid in ids]

    def get_stats(self) -> Stats:
        return self.llm_engine.get_stats()
