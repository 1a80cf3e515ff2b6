"""The server's guards in front of the routes: the API key (a pure ASGI middleware) and the request body (size
limit, JSON that cannot break the parser), each answering in OpenAI's error shape.

The key is checked in pure ASGI rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` hands
the route a receive channel that never reports ``http.disconnect``, so ``request.is_disconnected()`` stayed False
and a request whose client had left was generated to its end.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from fastapi import Request

from paged_serve.entrypoints.openai.serving_engine import OpenAIError

API_KEY_ENV = "PAGED_SERVE_API_KEY"  # vLLM: VLLM_API_KEY
UNPROTECTED_PATHS = ("/health",)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


class APIKeyMiddleware:
    """Every HTTP request but ``/health`` needs ``Authorization: Bearer <key>`` (the scheme in any case).

    Digests of the keys are compared in constant time, so neither the content nor the length of the key leaks
    through timing."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = _digest(api_key)

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        value = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), "")
        scheme, _, token = value.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()), self.expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in UNPROTECTED_PATHS or self.authorized(scope["headers"]):
            return await self.app(scope, receive, send)
        response = OpenAIError("invalid or missing API key", 401, "authentication_error").response()
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send)


async def read_json(request: Request, max_bytes: int) -> object:
    """The body as JSON, or an ``OpenAIError``: 413 past ``max_bytes`` (checked on the declared length and while
    reading, so a large body is never held whole), 400 for invalid UTF-8, invalid JSON or nesting too deep."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise OpenAIError(f"request body of {int(declared)} bytes exceeds the limit of {max_bytes}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise OpenAIError(f"request body exceeds the limit of {max_bytes} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise OpenAIError(f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise OpenAIError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise OpenAIError("invalid JSON: nested too deeply") from None
