"""vLLM's ``entrypoints/openai/protocol.py`` path: the request bodies are in ``paged_serve._compat.openai``."""

from paged_serve._compat.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    ErrorInfo,
    ErrorResponse,
    ResponseFormat,
    StreamOptions,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "ErrorInfo",
    "ErrorResponse",
    "ResponseFormat",
    "StreamOptions",
]
