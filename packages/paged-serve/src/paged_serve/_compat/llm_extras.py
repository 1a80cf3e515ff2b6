"""The rest of vLLM's ``LLM`` surface (``entrypoints/llm.py``) over the core engine: request options
(``priority``, ``tokenization_kwargs``), ``reset_prefix_cache``, ``collective_rpc``, ``get_metrics`` (vLLM
``v1/metrics/reader.py``'s ``Metric`` objects), and vLLM's wording where paged_serve has no mechanism."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from paged_serve.core.block_allocator import BlockAllocator
from paged_serve.core.prefix_caching import PrefixCachingBlockAllocator
from paged_serve.engine.metrics import Stats

logger = logging.getLogger(__name__)

# vLLM's LLM.encode without a pooling task, word for word
POOLING_TASK_REQUIRED = (
    "pooling_task required for `LLM.encode`\n"
    "Please use one of the more specific methods or set the pooling_task when using `LLM.encode`:\n"
    '  - For embeddings, use `LLM.embed(...)` or `pooling_task="embed"`.\n'
    '  - For classification logits, use `LLM.classify(...)` or `pooling_task="classify"`.\n'
    "  - For similarity scores, use `LLM.score(...)`.\n"
    '  - For rewards, use `LLM.reward(...)` or `pooling_task="token_classify"`\n'
    '  - For token classification, use `pooling_task="token_classify"`\n'
    '  - For multi-vector retrieval, use `pooling_task="token_embed"`'
)
PROFILER_OFF = "Profiler is not enabled. paged_serve has no profiler config: wrap LLM.generate in torch.profiler."
TOKENIZATION_KWARGS = ("add_special_tokens", "truncate_prompt_tokens")


def check_priority(priority: list[int] | None, num_prompts: int) -> None:
    """vLLM's checks of ``generate(priority=...)``; only the FCFS scheduler exists here, so only zeros pass."""
    if priority is None:
        return
    if len(priority) != num_prompts:
        raise ValueError(f"The lengths of prompts ({num_prompts}) and priority ({len(priority)}) must be the same.")
    for p in priority:
        if p != 0:
            raise ValueError(f"Got priority {p} but Priority scheduling is not enabled.")


def tokenize_prompts(tokenizer, items: list[tuple], kwargs: dict, max_model_len: int) -> list[tuple]:
    """``(text, ids)`` prompts with ``tokenization_kwargs`` applied: text tokenized with ``add_special_tokens``,
    then every prompt cut to its last ``truncate_prompt_tokens`` ids (-1: ``max_model_len``), as vLLM truncates."""
    unknown = sorted(set(kwargs) - set(TOKENIZATION_KWARGS))
    if unknown:
        raise ValueError(f"tokenization_kwargs {unknown} are not supported; supported: {list(TOKENIZATION_KWARGS)}")
    keep = kwargs.get("truncate_prompt_tokens")
    if keep == -1:
        keep = max_model_len
    if keep is not None and not (isinstance(keep, int) and keep >= 1):
        raise ValueError(f"truncate_prompt_tokens must be -1 or an int >= 1, got {keep!r}")
    out = []
    for text, ids in items:
        if ids is None and text is not None and tokenizer is not None:
            ids = tokenizer.encode(text, add_special_tokens=kwargs.get("add_special_tokens", True))
        out.append((text, ids[-keep:] if keep is not None and ids is not None else ids))
    return out


def reset_prefix_cache(engine, reset_running_requests: bool = False) -> bool:
    """Evict every cached prefix block and zero the hit counters. Like vLLM's block pool, it refuses (False, with
    vLLM's warning) while requests hold blocks: their cached blocks are in use."""
    manager = engine.scheduler.block_manager
    allocator = manager.gpu_allocator
    if not isinstance(allocator, PrefixCachingBlockAllocator):
        return True  # prefix caching is off: nothing is cached
    if manager.block_tables:
        if reset_running_requests:
            logger.warning("reset_running_requests: paged_serve cannot preempt requests to reset the prefix cache")
        held = allocator.get_num_total_blocks() - allocator.get_num_free_blocks()
        logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", held)
        return False
    for block in allocator.evictor.blocks():
        allocator.evictor.remove(block.block_hash)
        del allocator.cached_blocks[block.block_hash]
        BlockAllocator._release(allocator, block)  # its content forgotten, back on the plain free list
    allocator.num_queries = allocator.num_hits = 0
    return True


def collective_rpc(engine, method, args: tuple, kwargs: dict) -> list:
    """``method`` (a ``Worker`` method's name, or a function whose first argument is the worker) on every rank.

    The tensor-parallel workers' loop only runs model steps, so ranks beyond the driver are refused by name."""
    if engine.parallel_config.world_size > 1:
        raise NotImplementedError(
            "collective_rpc / apply_model with tensor_parallel_size > 1: paged_serve's worker processes run model "
            "steps only; use tensor_parallel_size=1"
        )
    worker = engine.model_executor.driver_worker
    call = getattr(worker, method) if isinstance(method, str) else functools.partial(method, worker)
    return [call(*args, **kwargs)]


@dataclass
class Metric:
    """vLLM's ``v1/metrics/reader.Metric``: a metric's name and labels."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Gauge(Metric):
    value: float


def snapshot_metrics(stats: Stats, labels: dict[str, str]) -> list[Metric]:
    """The engine's ``Stats`` as vLLM's metric objects, under vLLM v1's metric names and labels."""
    return [
        Gauge("vllm:num_requests_running", labels, float(stats.num_running)),
        Gauge("vllm:num_requests_waiting", labels, float(stats.num_waiting)),
        Gauge("vllm:kv_cache_usage_perc", labels, float(stats.gpu_cache_usage)),
        Counter("vllm:num_preemptions", labels, stats.num_preemptions_recompute + stats.num_preemptions_swap),
        Counter("vllm:prompt_tokens", labels, stats.prompt_tokens_total),
        Counter("vllm:generation_tokens", labels, stats.generation_tokens_total),
    ]
