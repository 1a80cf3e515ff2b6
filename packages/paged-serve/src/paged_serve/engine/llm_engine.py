"""``LLMEngine`` (vLLM v0 ``engine/llm_engine.py``): one call to ``step`` is one iteration of continuous batching.

``step``: the scheduler picks this step's sequences -> the cache engine applies its swap/copy decisions -> the model
runner runs one packed forward pass -> the sampler picks the next tokens -> the output processor appends them,
forks, stops and frees -> ``RequestOutput`` s for the requests that moved. Requests join (``add_request``) and
leave (finish, ``abort_request``) between any two steps.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from paged_serve.config import CacheConfig
from paged_serve.core.scheduler import Scheduler
from paged_serve.core.sequence import Logprob, Sequence, SequenceGroup
from paged_serve.engine.arg_utils import EngineArgs
from paged_serve.engine.beam_search import BeamSearchProcessor
from paged_serve.engine.metrics import StatLogger, Stats
from paged_serve.engine.output_processor import OutputProcessor, RequestState
from paged_serve.engine.request_checks import ProcessedRequest, check_fits
from paged_serve.engine.stop_checker import StopChecker
from paged_serve.inputs import PromptType, parse_prompt
from paged_serve.model_executor.layers.sampler import Sampler, SampleRow
from paged_serve.model_executor.model_loader import get_model, load_hf_config, resolve_dtype
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams
from paged_serve.transformers_utils.tokenizer import Tokenizer
from paged_serve.worker.cache_engine import CacheEngine
from paged_serve.worker.kv_budget import determine_num_blocks
from paged_serve.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def _eos_token_ids(model_dir: Path, hf_config: dict, tokenizer: Tokenizer | None) -> set[int]:
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


class LLMEngine:
    def __init__(self, engine_args: EngineArgs):
        args = self.engine_args = engine_args
        if args.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            if args.device == "cuda" and not torch.cuda.is_available():
                raise ValueError("device='cuda' but no CUDA device is available")
            self.device = torch.device(args.device)
        model_dir = Path(args.model)
        self.hf_config = load_hf_config(model_dir)
        self.dtype = resolve_dtype(args.dtype, self.hf_config)
        model_max_len = self.hf_config.get("max_position_embeddings") or self.hf_config.get("n_positions") or 2048
        self.scheduler_config = args.create_scheduler_config(model_max_len)
        self.tokenizer = None if args.skip_tokenizer_init else Tokenizer(args.tokenizer or args.model)
        self.eos_token_ids = _eos_token_ids(model_dir, self.hf_config, self.tokenizer)
        self.model = get_model(model_dir, self.dtype, self.device, self.hf_config)
        self.vocab_size = self.hf_config["vocab_size"]
        num_layers = self.hf_config.get("num_hidden_layers") or self.hf_config["n_layer"]
        geometry = (args.block_size, num_layers, self.model.num_kv_heads, self.model.head_dim, self.dtype)
        num_gpu, num_cpu = determine_num_blocks(args, self.model, geometry, self.device, self.scheduler_config)
        max_len = self.scheduler_config.max_model_len
        if num_gpu * args.block_size < max_len:
            raise ValueError(
                f"max_model_len ({max_len}) is larger than the KV cache holds ({num_gpu} blocks x {args.block_size} "
                f"tokens): lower max_model_len or give the cache more blocks / memory"
            )
        self.cache_config = CacheConfig(
            args.block_size,
            args.gpu_memory_utilization,
            args.swap_space,
            enable_prefix_caching=args.enable_prefix_caching,
        )
        self.cache_config.num_gpu_blocks, self.cache_config.num_cpu_blocks = num_gpu, num_cpu
        self.cache_engine = CacheEngine(
            num_layers,
            self.model.num_kv_heads,
            self.model.head_dim,
            args.block_size,
            num_gpu,
            num_cpu,
            self.dtype,
            self.device,
        )
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config)
        self.model_runner = ModelRunner(self.model, args.block_size, self.device)
        self.sampler = Sampler(torch.Generator(self.device).manual_seed(args.seed))
        self.seq_counter = itertools.count()
        self.output_processor = OutputProcessor(self.scheduler, self.tokenizer, StopChecker(max_len), self.seq_counter)
        self.beam_search = BeamSearchProcessor(self.output_processor)
        self.requests: dict[str, RequestState] = {}
        self.stat_logger = StatLogger()
        logger.info("KV cache: %d device blocks, %d CPU blocks of %d tokens", num_gpu, num_cpu, args.block_size)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args)

    # -------------------------------------------------------------- requests
    def process_request(
        self, prompt: PromptType | None, params: SamplingParams | None, prompt_token_ids: list[int] | None = None
    ) -> ProcessedRequest:
        """Tokenize and check a request without touching the scheduler (vLLM v1's ``Processor``): safe to call from
        any thread, so a server can refuse a bad request before it answers anything."""
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        text, ids = parse_prompt(prompt if prompt is not None else {"prompt_token_ids": list(prompt_token_ids)})
        params = (params or SamplingParams()).clone()
        if self.tokenizer is None:
            if ids is None:
                raise ValueError("skip_tokenizer_init=True: prompts must be token ids (a TokensPrompt)")
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
        if params.logprobs is not None and params.logprobs > self.engine_args.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} exceeds max_logprobs={self.engine_args.max_logprobs}")
        if params.prompt_logprobs is not None:
            if params.prompt_logprobs > self.engine_args.max_logprobs:
                raise ValueError(
                    f"prompt_logprobs={params.prompt_logprobs} exceeds max_logprobs={self.engine_args.max_logprobs}"
                )
            if self.cache_config.enable_prefix_caching:
                raise ValueError("prompt_logprobs needs every prompt token computed: not with enable_prefix_caching")
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise ValueError(f"logit_bias token id {max(params.logit_bias)} is outside [0, {self.vocab_size})")
        check_fits(params, len(ids), self.scheduler_config, self.cache_config)
        params.update_from_generation_config(self.eos_token_ids)
        return ProcessedRequest(text, ids, params)

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
        self.cache_engine.swap_out(outs.blocks_to_swap_out)
        self.cache_engine.swap_in(outs.blocks_to_swap_in)
        self.cache_engine.copy(outs.blocks_to_copy)
        num_prompt = num_gen = 0
        if metas:
            model_input = self.model_runner.prepare_input(metas)
            logits = self.model_runner.execute_model(model_input, self.cache_engine.gpu_cache)
            self.scheduler.update_from_output(outs)
            num_prompt = model_input.attn_metadata.num_prefill_tokens
            num_gen = len(model_input.sampled_seqs)
            if model_input.prompt_rows:
                self._record_prompt_logprobs(model_input.prompt_rows, logits[num_gen:])
            self._sample_and_process(model_input.sampled_seqs, logits[:num_gen])
        finished = self.scheduler.free_finished_seq_groups()
        outputs = []
        moved = [s.seq_group for s in outs.scheduled_seq_groups] + list(outs.ignored_seq_groups)
        for group in moved:
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

    def _sample_and_process(self, sampled_seqs, logits: torch.Tensor) -> None:
        rows, plain, beams = [], [], {}
        for i, (meta, seq) in enumerate(sampled_seqs):
            state = self.requests[meta.request_id]
            if state.params.use_beam_search:
                beams.setdefault(meta.request_id, []).append((i, seq))
                continue
            first = seq.get_output_len() == 0 and state.group.num_seqs() == 1
            num = state.params.best_of if first else 1
            rows.append(SampleRow(state.params, seq.prompt_token_ids, seq.output_token_ids, state.generator, num))
            plain.append((i, state, seq))
        if plain:
            index = torch.tensor([i for i, _, _ in plain], device=logits.device)
            for (_, state, seq), result in zip(plain, self.sampler(logits[index], rows)):
                self.output_processor.process_sample(state, seq, result)
        for request_id, members in beams.items():
            index = torch.tensor([i for i, _ in members], device=logits.device)
            self.beam_search.step(self.requests[request_id], [s for _, s in members], logits[index], self.sampler)

    def _record_prompt_logprobs(self, rows, logits: torch.Tensor) -> None:
        """vLLM's ``prompt_logprobs``: each prompt token's logprob given the tokens before it (the first has none),
        with its rank and the request's top-k; recorded once (a recomputed prefill scores nothing new)."""
        logprobs = logits.float().log_softmax(dim=-1)
        targets = torch.tensor([self.requests[m.request_id].group.prompt_token_ids[i] for m, i in rows])
        chosen = logprobs.gather(1, targets.to(logprobs.device)[:, None])
        ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
        top = max(self.requests[m.request_id].params.prompt_logprobs for m, _ in rows)
        values, indices = logprobs.topk(top) if top else (None, None)
        for row, ((meta, index), rank) in enumerate(zip(rows, ranks)):
            group = self.requests[meta.request_id].group
            recorded = group.prompt_logprobs = group.prompt_logprobs or [None]
            if index != len(recorded):
                continue
            entry = {int(targets[row]): Logprob(float(chosen[row]), rank)}
            k = self.requests[meta.request_id].params.prompt_logprobs
            if k:
                for r, (v, t) in enumerate(zip(values[row, :k].tolist(), indices[row, :k].tolist()), start=1):
                    entry.setdefault(t, Logprob(v, r))
            recorded.append(entry)

    # ----------------------------------------------------------------- stats
    def get_stats(self) -> Stats:
        manager = self.scheduler.block_manager
        stats = Stats(**self.stat_logger.totals.as_dict())
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.num_swapped = len(self.scheduler.swapped)
        total_gpu, total_cpu = self.cache_config.num_gpu_blocks, self.cache_config.num_cpu_blocks
        stats.gpu_cache_usage = 1.0 - manager.get_num_free_gpu_blocks() / total_gpu if total_gpu else 0.0
        stats.cpu_cache_usage = 1.0 - manager.get_num_free_cpu_blocks() / total_cpu if total_cpu else 0.0
        stats.kv_utilization = manager.get_kv_utilization()
        stats.prefix_cache_hit_rate = manager.get_prefix_cache_hit_rate()
        stats.num_preemptions_recompute = self.scheduler.num_preemptions["recompute"]
        stats.num_preemptions_swap = self.scheduler.num_preemptions["swap"]
        stats.prompt_throughput, stats.generation_throughput = self.stat_logger.throughputs()
        return stats
