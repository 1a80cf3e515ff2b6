"""How many KV blocks each pool gets (vLLM ``Worker.determine_num_available_blocks``).

In order: an explicit block count; a byte budget (``kv_cache_memory_bytes``); on CUDA, ``gpu_memory_utilization``
of the device minus the weights and the peak activations of a profiling forward pass at the largest batch; on CPU
4 GiB (vLLM CPU's ``VLLM_CPU_KVCACHE_SPACE`` default). A derived (not explicit) count is capped at what
``max_num_seqs`` sequences of ``max_model_len`` tokens can use. The CPU swap pool is ``swap_space`` GiB unless
``num_cpu_blocks_override`` is given.
"""

from __future__ import annotations

import logging

import torch

from paged_serve._infra import config_checks
from paged_serve.config import CacheConfig, SchedulerConfig
from paged_serve.distributed.parallel_state import GroupCoordinator
from paged_serve.model_executor.layers.attention import AttentionMetadata
from paged_serve.worker.cache_engine import CacheEngine

logger = logging.getLogger(__name__)
GiB = 1 << 30
CPU_KV_CACHE_BYTES = 4 * GiB


@torch.inference_mode()
def _profile_cuda_bytes(model, geometry, device, config: SchedulerConfig, utilization: float) -> int:
    """Bytes left for the KV cache after the weights and one largest-batch forward pass (peak memory)."""
    block_size, num_layers, kv_heads, head_dim, dtype = geometry
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    non_torch = (total - free) - torch.cuda.memory_allocated(device)
    tokens = config.max_num_batched_tokens
    seq_len = min(tokens, config.max_model_len)
    num_seqs = -(-tokens // seq_len)
    blocks_per_seq = -(-seq_len // block_size)
    cache = CacheEngine(num_layers, kv_heads, head_dim, block_size, num_seqs * blocks_per_seq, 0, dtype, device)
    lens = [min(seq_len, tokens - i * seq_len) for i in range(num_seqs)]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=device).view(num_seqs, blocks_per_seq)
    slots = torch.cat(
        [
            tables[i].long().repeat_interleave(block_size)[:n] * block_size
            + torch.arange(n, device=device) % block_size
            for i, n in enumerate(lens)
        ]
    )
    md = AttentionMetadata(
        num_prefill_tokens=tokens,
        num_decode_tokens=0,
        slot_mapping=slots,
        prefill_block_tables=tables,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        prefill_context_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        max_query_len=seq_len,
    )
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    hidden = model(torch.zeros(tokens, dtype=torch.long, device=device), positions, cache.gpu_cache, md)
    model.compute_logits(hidden[-num_seqs:])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - cache.num_bytes()["gpu"]
    del cache, hidden
    torch.cuda.empty_cache()
    return int(total * utilization - peak - non_torch)


def determine_num_blocks(
    cache: CacheConfig, model, geometry, device: torch.device, config: SchedulerConfig
) -> tuple[int, int]:
    block_bytes = CacheEngine.get_cache_block_size(*geometry)
    block_size = geometry[0]
    cap = config.max_num_seqs * -(-config.max_model_len // block_size)
    if cache.num_gpu_blocks_override is not None:
        num_gpu = cache.num_gpu_blocks_override
    else:
        if cache.kv_cache_memory_bytes is not None:
            budget = cache.kv_cache_memory_bytes
        elif device.type == "cuda":
            budget = _profile_cuda_bytes(model, geometry, device, config, cache.gpu_memory_utilization)
        else:
            budget = CPU_KV_CACHE_BYTES
        num_gpu = min(budget // block_bytes, cap)
        config_checks.check_kv_budget(num_gpu, budget, block_bytes)
    if cache.num_cpu_blocks_override is not None:
        num_cpu = cache.num_cpu_blocks_override
    else:
        num_cpu = min(int(cache.swap_space * GiB) // block_bytes, cap)
    return int(num_gpu), int(num_cpu)


def initialize_kv_cache(cache: CacheConfig, config: SchedulerConfig, model, num_layers: int, dtype: torch.dtype,
                        device: torch.device, tp_group: GroupCoordinator | None = None) -> CacheEngine:  # fmt: skip
    """Size both pools (``determine_num_blocks``), record the counts in ``cache`` and allocate every layer's KV
    cache (vLLM ``Worker.initialize_cache``); the device pool must hold at least one ``max_model_len`` sequence."""
    geometry = (cache.block_size, num_layers, model.num_kv_heads, model.head_dim, dtype)
    # every rank must hold the same blocks: the fewest any rank can (vLLM's executor takes the minimum)
    num_blocks = determine_num_blocks(cache, model, geometry, device, config)
    num_gpu, num_cpu = (tp_group or GroupCoordinator()).min_over_ranks(num_blocks)
    config_checks.check_kv_holds_a_sequence(num_gpu, cache.block_size, config.max_model_len)
    cache.num_gpu_blocks, cache.num_cpu_blocks = num_gpu, num_cpu
    logger.info("KV cache: %d device blocks, %d CPU blocks of %d tokens", num_gpu, num_cpu, cache.block_size)
    return CacheEngine(num_layers, model.num_kv_heads, model.head_dim, cache.block_size, num_gpu, num_cpu, dtype,
                       device)  # fmt: skip
