"""``LLMEngine`` (vLLM v0 ``engine/llm_engine.py``): one call to ``step`` is one iteration of continuous batching.

``step``: the scheduler picks this step's sequences -> the model runner packs them into one batch -> the executor
runs it on every rank (each applies the swap/copy decisions to its cache, then the forward pass; with
``tensor_parallel_size`` N the other ranks are worker processes) -> the sampler picks the next tokens from the
logits gathered here and the output processor appends them, forks, stops and frees -> ``RequestOutput`` s for the
requests that moved. Requests join (``add_request``) and leave (finish, ``abort_request``) between any two steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import torch

from paged_serve.config import VllmConfig
from paged_serve.core.scheduler import Scheduler
from paged_serve.core.sequence import Sequence, SequenceGroup
from paged_serve.engine.input_processor import InputProcessor, ProcessedRequest, eos_token_ids
from paged_serve.engine.metrics import StatLogger, Stats
from paged_serve.engine.output_processor import OutputProcessor, RequestState
from paged_serve.engine.prompt_logprobs import record_prompt_logprobs
from paged_serve.engine.stop_checker import StopChecker
from paged_serve.executor.multiproc_executor import MultiprocExecutor
from paged_serve.inputs import PromptType
from paged_serve.model_executor.layers.sampler import Sampler
from paged_serve.model_executor.model_loader import load_hf_config
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams
from paged_serve.transformers_utils.tokenizer import Tokenizer
from paged_serve.worker.worker import ExecuteModelRequest


class LLMEngine:
    def __init__(self, vllm_config: VllmConfig):
        self.model_config = model_config = vllm_config.model_config
        self.cache_config, self.scheduler_config = vllm_config.cache_config, vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        model_dir = Path(model_config.model)
        self.hf_config = load_hf_config(model_dir)
        self.parallel_config.verify_with_hf_config(self.hf_config)  # before any worker starts
        self.tokenizer = None
        if not model_config.skip_tokenizer_init:
            self.tokenizer = Tokenizer(model_config.tokenizer or model_config.model)
        self.model_executor = MultiprocExecutor(vllm_config)  # the driver's Worker here, the other ranks' processes
        driver = self.model_executor.driver_worker
        self.model, self.cache_engine, self.model_runner = driver.model, driver.cache_engine, driver.model_runner
        self.device, self.dtype = driver.device, driver.dtype
        self.vocab_size = self.hf_config["vocab_size"]
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config)
        self.sampler = Sampler(torch.Generator(self.device).manual_seed(model_config.seed))
        self.seq_counter = itertools.count()
        stop_checker = StopChecker(self.scheduler_config.max_model_len)
        self.output_processor = OutputProcessor(self.scheduler, self.tokenizer, stop_checker, self.seq_counter)
        eos_ids = eos_token_ids(model_dir, self.hf_config, self.tokenizer)
        self.input_processor = InputProcessor(self.tokenizer, self.vocab_size, eos_ids, model_config,
                                              self.scheduler_config, self.cache_config)  # fmt: skip
        self.requests: dict[str, RequestState] = {}
        self.stat_logger = StatLogger()

    @classmethod
    def from_engine_args(cls, engine_args) -> LLMEngine:
        """vLLM's constructor from ``EngineArgs`` (``paged_serve.EngineArgs``): it builds the ``VllmConfig``."""
        return cls(engine_args.create_engine_config())

    # -------------------------------------------------------------- requests
    def process_request(
        self, prompt: PromptType | None, params: SamplingParams | None, prompt_token_ids: list[int] | None = None
    ) -> ProcessedRequest:
        """Tokenize and check a request without touching the scheduler: safe to call from any thread."""
        return self.input_processor.process(prompt, params, prompt_token_ids)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType | None = None,
        params: SamplingParams | None = None,
        prompt_token_ids: list[int] | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request: ``prompt`` is vLLM's ``PromptType`` (text, ``TextPrompt`` or ``TokensPrompt``), or the
        ids come as ``prompt_token_ids``."""
        self.add_processed_request(request_id, self.process_request(prompt, params, prompt_token_ids), arrival_time)

    def add_processed_request(
        self, request_id: str, request: ProcessedRequest, arrival_time: float | None = None
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt, prompt_token_ids, params = request
        seq = Sequence(next(self.seq_counter), prompt_token_ids, self.cache_config.block_size, prompt)
        group = SequenceGroup(request_id, [seq], arrival_time=arrival_time, sampling_params=params)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        self.requests[request_id] = RequestState(group, params, generator, index={seq.seq_id: 0})
        self.scheduler.add_seq_group(group)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.scheduler.abort_seq_group(ids)
        for rid in ids:
            self.requests.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        metas, outs = self.scheduler.schedule()
        model_input = self.model_runner.prepare_input(metas) if metas else None
        request = ExecuteModelRequest(outs.blocks_to_swap_in, outs.blocks_to_swap_out, outs.blocks_to_copy, model_input)
        logits = self.model_executor.execute_model(request)  # every rank: swaps, copies, forward; logits here
        num_prompt = num_gen = 0
        if metas:
            self.scheduler.update_from_output(outs)  # the scheduled tokens have KV now
            num_prompt = model_input.attn_metadata.num_prefill_tokens
            num_gen = len(model_input.sampled_seqs)  # the sampled rows come first, then prompt_logprobs rows
            if model_input.prompt_rows:
                record_prompt_logprobs(self.requests, model_input.prompt_rows, logits[num_gen:])
            self.output_processor.process_outputs(self.requests, model_input.sampled_seqs, logits[:num_gen],
                                                  self.sampler)  # fmt: skip
        finished = self.scheduler.free_finished_seq_groups()
        outputs = []
        for group in [s.seq_group for s in outs.scheduled_seq_groups] + list(outs.ignored_seq_groups):
            state = self.requests.get(group.request_id)
            if state is None:
                continue
            output = self.output_processor.make_output(state)
            if output is not None:
                outputs.append(output)
            if group.is_finished():
                del self.requests[group.request_id]
        self.stat_logger.record_step(num_prompt, num_gen, len(finished) + len(outs.ignored_seq_groups))
        return outputs

    def get_stats(self) -> Stats:
        return self.stat_logger.snapshot(self.scheduler, self.cache_config)

    def shutdown(self) -> None:
        """Stop the executor's worker processes (vLLM ``LLMEngine.shutdown``); nothing outlives the engine. Then
        drop the requests, the model and the KV cache, so a second engine in the process has the memory.
        Idempotent; ``__del__`` calls it (``del llm``)."""
        if getattr(self, "model_executor", None) is None:
            return
        self.model_executor.shutdown()
        self.abort_request(list(self.requests))
        self.model_executor = self.model = self.model_runner = self.cache_engine = None

    def __del__(self):
        self.shutdown()
