"""The API key in front of every route but ``/health`` (vLLM's ``--api-key`` / ``VLLM_API_KEY``), a pure ASGI middleware
answering 401 in OpenAI's error shape.

Pure ASGI rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` hands the route a receive
channel that never reports ``http.disconnect``, so ``request.is_disconnected()`` stayed False and a request whose
client had left was generated to its end.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.responses import JSONResponse

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
        error = {"message": "invalid or missing API key", "type": "authentication_error", "param": None, "code": 401}
        response = JSONResponse({"error": error}, status_code=401, headers={"www-authenticate": "Bearer"})
        await response(scope, receive, send)
