"""vLLM's ``v1/metrics/reader.py`` path: the metric objects ``LLM.get_metrics()`` returns."""

from paged_serve._compat.llm_extras import Counter, Gauge, Metric

__all__ = ["Counter", "Gauge", "Metric"]
