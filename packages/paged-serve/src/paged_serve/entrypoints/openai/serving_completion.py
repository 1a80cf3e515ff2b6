"""vLLM's ``entrypoints/openai/serving_completion.py`` path: see ``paged_serve._compat.openai``."""

from paged_serve._compat.openai.serving_completion import OpenAIServingCompletion

__all__ = [
    "OpenAIServingCompletion",
]
