"""The OpenAI-compatible server (vLLM ``entrypoints/openai/api_server.py``) over FastAPI and uvicorn.

Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics`` (Prometheus
text). Every error is an OpenAI error body with a 4xx status: invalid JSON or fields 400, unknown model 404, a
full waiting queue 429. With an API key, every route but ``/health`` needs ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import hmac
import logging
import socket

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from paged_serve.engine.async_llm_engine import AsyncLLMEngine, QueueFullError
from paged_serve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from paged_serve.entrypoints.openai.serving_chat import OpenAIServingChat
from paged_serve.entrypoints.openai.serving_completion import OpenAIServingCompletion
from paged_serve.entrypoints.openai.serving_engine import OpenAIError

logger = logging.getLogger(__name__)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"invalid JSON: {first.get('msg')}", None
    return f"{'.'.join(loc) or 'body'}: {first.get('msg')}", (loc[0] if loc else None)


def build_app(engine: AsyncLLMEngine, served_model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="paged-serve", docs_url=None, redoc_url=None)
    completion = OpenAIServingCompletion(engine, served_model_name)
    chat = OpenAIServingChat(engine, served_model_name)

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return OpenAIError("invalid or missing API key", 401, "authentication_error").response()
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return OpenAIError(message, 400, param=param).response()

    @app.exception_handler(OpenAIError)
    async def on_openai_error(_, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(QueueFullError)
    async def on_queue_full(_, exc: QueueFullError):
        return OpenAIError(f"server overloaded: {exc}", 429, "rate_limit_exceeded").response()

    @app.get("/health")
    async def health():
        if engine.errored is not None:
            return PlainTextResponse("engine failed", status_code=503)
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        max_len = engine.engine.scheduler_config.max_model_len
        card = {"id": served_model_name, "object": "model", "owned_by": "paged-serve", "max_model_len": max_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            engine.engine.get_stats().to_prometheus(served_model_name), media_type="text/plain; version=0.0.4"
        )

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await completion.create_completion(body, request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await chat.create_chat_completion(body, request)

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    import uvicorn

    sock = bind_socket(host, port)
    logger.info("serving on http://%s:%d", host, sock.getsockname()[1])
    uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
