"""vLLM's ``entrypoints/openai/serving_engine.py`` path: lives in ``paged_serve._compat.openai.serving_engine``."""

from paged_serve._compat.openai.serving_engine import OpenAIError, OpenAIServing, guard_stream, sse

__all__ = [
    "OpenAIError",
    "OpenAIServing",
    "guard_stream",
    "sse",
]
