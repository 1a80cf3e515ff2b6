"""The server's ``/metrics``: engine ``Stats`` in Prometheus' text format, under vLLM's metric names where vLLM has
them (vLLM ``engine/metrics.py``'s ``PrometheusStatLogger``)."""

from __future__ import annotations

from paged_serve.engine.metrics import Stats


def to_prometheus(stats: Stats, model_name: str) -> str:
    """Prometheus text exposition, one ``# TYPE`` line and one sample per metric, labelled with the model name."""
    label = f'{{model_name="{model_name}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", stats.num_running),
        ("vllm:num_requests_waiting", "gauge", stats.num_waiting),
        ("vllm:num_requests_swapped", "gauge", stats.num_swapped),
        ("vllm:gpu_cache_usage_perc", "gauge", stats.gpu_cache_usage),
        ("vllm:cpu_cache_usage_perc", "gauge", stats.cpu_cache_usage),
        ("paged_serve:kv_utilization", "gauge", stats.kv_utilization),
        ("vllm:gpu_prefix_cache_hit_rate", "gauge", stats.prefix_cache_hit_rate),
        ("vllm:num_preemptions_total", "counter", stats.num_preemptions_recompute + stats.num_preemptions_swap),
        ("paged_serve:num_preemptions_recompute_total", "counter", stats.num_preemptions_recompute),
        ("paged_serve:num_preemptions_swap_total", "counter", stats.num_preemptions_swap),
        ("vllm:prompt_tokens_total", "counter", stats.prompt_tokens_total),
        ("vllm:generation_tokens_total", "counter", stats.generation_tokens_total),
        ("vllm:avg_prompt_throughput_toks_per_s", "gauge", stats.prompt_throughput),
        ("vllm:avg_generation_throughput_toks_per_s", "gauge", stats.generation_throughput),
        ("vllm:request_success_total", "counter", stats.num_requests_finished),
    ]
    lines = []
    for name, kind, value in rows:
        lines += [f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
    return "\n".join(lines) + "\n"
