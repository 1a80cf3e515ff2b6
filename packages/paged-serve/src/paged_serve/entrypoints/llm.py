"""vLLM's ``entrypoints/llm.py`` path: ``LLM`` lives in ``paged_serve._compat.llm``."""

from paged_serve._compat.llm import LLM

__all__ = ["LLM"]
