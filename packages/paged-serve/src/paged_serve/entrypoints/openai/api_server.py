"""The OpenAI-compatible server (vLLM ``entrypoints/openai/api_server.py``) over FastAPI and uvicorn.

Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics`` (Prometheus
text). Every error, 404 and 405 included, is an OpenAI error body ``{"error": {"message", "type", "param",
"code"}}``: invalid JSON or fields 400, a missing or wrong API key 401, unknown model 404, a body past the size
limit 413, a full waiting queue 429, a dead engine 503. A request is admitted into the engine before its response
starts, so a streamed request gets these statuses too; an error after the stream started is an error event
followed by ``data: [DONE]``.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged_serve.engine.async_llm_engine import AsyncLLMEngine
from paged_serve.entrypoints.openai.middleware import APIKeyMiddleware, read_json
from paged_serve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from paged_serve.entrypoints.openai.serving_chat import OpenAIServingChat
from paged_serve.entrypoints.openai.serving_completion import OpenAIServingCompletion
from paged_serve.entrypoints.openai.serving_engine import OpenAIError

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


def _validation_message(errors: list) -> tuple[str, str | None]:
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"invalid JSON: {first.get('msg')}", None
    return f"{'.'.join(loc) or 'body'}: {first.get('msg')}", (loc[0] if loc else None)


def build_app(
    engine: AsyncLLMEngine,
    served_model_name: str,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    app = FastAPI(title="paged-serve", docs_url=None, redoc_url=None, openapi_url=None)
    completion = OpenAIServingCompletion(engine, served_model_name)
    chat = OpenAIServingChat(engine, served_model_name)
    created = int(time.time())
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)

    @app.exception_handler(OpenAIError)
    async def on_openai_error(_, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_, exc: StarletteHTTPException):
        kind = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(exc.status_code, "invalid_request_error")
        response = OpenAIError(str(exc.detail), exc.status_code, kind).response()
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def on_crash(_, exc: Exception):
        logger.exception("request failed")
        return OpenAIError(f"internal server error: {type(exc).__name__}", 500, "internal_server_error").response()

    async def parse(request: Request, model):
        body = await read_json(request, max_request_bytes)
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            message, param = _validation_message(exc.errors())
            raise OpenAIError(message, 400, param=param) from None

    @app.get("/health")
    async def health():
        if engine.errored is not None:
            return PlainTextResponse("engine failed", status_code=503)
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        max_len = engine.engine.scheduler_config.max_model_len
        card = {
            "id": served_model_name,
            "object": "model",
            "created": created,
            "owned_by": "paged-serve",
            "root": engine.engine.engine_args.model,
            "parent": None,
            "max_model_len": max_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            engine.engine.get_stats().to_prometheus(served_model_name), media_type="text/plain; version=0.0.4"
        )

    @app.post("/v1/completions")
    async def create_completion(request: Request):
        return await completion.create_completion(await parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: Request):
        return await chat.create_chat_completion(await parse(request, ChatCompletionRequest), request)

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything slow happens, so a port in use fails in a second with one line naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot bind {host}:{port}: {exc.strerror}") from None
    return sock


def run_server(
    app: FastAPI,
    sock: socket.socket,
    engine: AsyncLLMEngine,
    log_level: str = "info",
    shutdown_timeout: float = 10.0,
) -> None:
    """Serve until SIGTERM / SIGINT, then shut down gracefully: in-flight requests get ``shutdown_timeout``
    seconds to finish, then the engine aborts them (each client gets a 503, or an error event in its stream) and
    this returns normally. uvicorn's own cancellation stays a later backstop (it would log tracebacks)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                logger.info("shutting down: in-flight requests have %.1f s", shutdown_timeout)
                timer = threading.Timer(shutdown_timeout, engine.abort_all, args=("the server is shutting down",))
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

    host, port = sock.getsockname()[:2]
    logger.info("serving on http://%s:%d", host, port)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout + 5)
    # uvicorn re-raises the signal it caught once it has stopped; a no-op handler here turns that into a return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    Server(config).run(sockets=[sock])
