"""vLLM's ``engine/async_llm_engine.py`` path: the server's engine loop is ``paged_serve._compat.async_llm_engine``."""

from paged_serve._compat.async_llm_engine import AsyncLLMEngine, QueueFullError, RequestAbortedError, RequestStream

__all__ = ["AsyncLLMEngine", "QueueFullError", "RequestAbortedError", "RequestStream"]
