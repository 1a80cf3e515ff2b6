"""Engine statistics (vLLM ``engine/metrics.py``): queue sizes, KV cache use, prefix-cache hits, preemptions, speed.

``Stats`` is a snapshot taken after a step (``StatLogger.snapshot``); ``LLM.get_stats()`` returns it and the server's
``/metrics`` renders it in Prometheus' text format. Throughputs are over the last ``window`` seconds of steps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass


@dataclass
class Stats:
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    gpu_cache_usage: float = 0.0  # device blocks in use / all device blocks
    cpu_cache_usage: float = 0.0
    kv_utilization: float = 0.0  # token slots filled / slots in the blocks held (paging's waste is 1 - this)
    prefix_cache_hit_rate: float = -1.0
    num_preemptions_recompute: int = 0
    num_preemptions_swap: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prompt_throughput: float = 0.0  # tokens/s
    generation_throughput: float = 0.0
    num_requests_finished: int = 0
    num_steps: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class StatLogger:
    """Accumulates per-step token counts; ``snapshot`` combines them with the scheduler's current state."""

    def __init__(self, window: float = 10.0):
        self.window = window
        self._steps: deque[tuple[float, int, int]] = deque()
        self.totals = Stats()

    def record_step(self, num_prompt_tokens: int, num_generation_tokens: int, num_finished: int) -> None:
        now = time.monotonic()
        self._steps.append((now, num_prompt_tokens, num_generation_tokens))
        while self._steps and now - self._steps[0][0] > self.window:
            self._steps.popleft()
        self.totals.prompt_tokens_total += num_prompt_tokens
        self.totals.generation_tokens_total += num_generation_tokens
        self.totals.num_requests_finished += num_finished
        self.totals.num_steps += 1

    def throughputs(self) -> tuple[float, float]:
        if len(self._steps) < 2:
            return 0.0, 0.0
        span = max(self._steps[-1][0] - self._steps[0][0], 1e-9)
        prompt = sum(p for _, p, _ in list(self._steps)[1:])
        gen = sum(g for _, _, g in list(self._steps)[1:])
        return prompt / span, gen / span

    def snapshot(self, scheduler, cache_config) -> Stats:
        """The totals so far with the scheduler's queues, its block manager's pools and its preemption counts."""
        manager = scheduler.block_manager
        stats = Stats(**self.totals.as_dict())
        stats.num_running, stats.num_waiting = len(scheduler.running), len(scheduler.waiting)
        stats.num_swapped = len(scheduler.swapped)
        total_gpu, total_cpu = cache_config.num_gpu_blocks, cache_config.num_cpu_blocks
        stats.gpu_cache_usage = 1.0 - manager.get_num_free_gpu_blocks() / total_gpu if total_gpu else 0.0
        stats.cpu_cache_usage = 1.0 - manager.get_num_free_cpu_blocks() / total_cpu if total_cpu else 0.0
        stats.kv_utilization = manager.get_kv_utilization()
        stats.prefix_cache_hit_rate = manager.get_prefix_cache_hit_rate()
        stats.num_preemptions_recompute = scheduler.num_preemptions["recompute"]
        stats.num_preemptions_swap = scheduler.num_preemptions["swap"]
        stats.prompt_throughput, stats.generation_throughput = self.throughputs()
        return stats
