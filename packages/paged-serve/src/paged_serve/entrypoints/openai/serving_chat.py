"""vLLM's ``entrypoints/openai/serving_chat.py`` path: lives in ``paged_serve._compat.openai.serving_chat``."""

from paged_serve._compat.openai.serving_chat import OpenAIServingChat

__all__ = ["OpenAIServingChat"]
