"""Engine statistics (vLLM ``engine/metrics.py``): queue sizes, KV cache use, prefix-cache hits, preemptions, speed.

``Stats`` is a snapshot taken after a step; ``LLM.get_stats()`` returns it and the server's ``/metrics`` renders it
in Prometheus' text format. Throughputs are over the last ``window`` seconds of steps.
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

    def to_prometheus(self, model_name: str) -> str:
        """Prometheus text exposition, with vLLM's metric names where vLLM has them."""
        label = f'{{model_name="{model_name}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", self.num_running),
            ("vllm:num_requests_waiting", "gauge", self.num_waiting),
            ("vllm:num_requests_swapped", "gauge", self.num_swapped),
            ("vllm:gpu_cache_usage_perc", "gauge", self.gpu_cache_usage),
            ("vllm:cpu_cache_usage_perc", "gauge", self.cpu_cache_usage),
            ("paged_serve:kv_utilization", "gauge", self.kv_utilization),
            ("vllm:gpu_prefix_cache_hit_rate", "gauge", self.prefix_cache_hit_rate),
            ("vllm:num_preemptions_total", "counter", self.num_preemptions_recompute + self.num_preemptions_swap),
            ("paged_serve:num_preemptions_recompute_total", "counter", self.num_preemptions_recompute),
            ("paged_serve:num_preemptions_swap_total", "counter", self.num_preemptions_swap),
            ("vllm:prompt_tokens_total", "counter", self.prompt_tokens_total),
            ("vllm:generation_tokens_total", "counter", self.generation_tokens_total),
            ("vllm:avg_prompt_throughput_toks_per_s", "gauge", self.prompt_throughput),
            ("vllm:avg_generation_throughput_toks_per_s", "gauge", self.generation_throughput),
            ("vllm:request_success_total", "counter", self.num_requests_finished),
        ]
        lines = []
        for name, kind, value in rows:
            lines += [f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
        return "\n".join(lines) + "\n"


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
