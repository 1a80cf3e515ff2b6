"""The OpenAI-compatible server (vLLM ``entrypoints/openai/api_server.py``) over FastAPI and uvicorn.

Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics`` (Prometheus
text), and FastAPI's ``/openapi.json`` and ``/docs`` built from the request and response models of ``protocol.py``
with this server's limits in them. A POST body must be ``application/json`` (415 otherwise). Every error, 404 and
405 included, is an OpenAI error body ``{"error": {"message", "type", "param", "code"}}``: invalid JSON or fields
400, a missing or wrong API key 401, unknown model 404, a body past the size limit 413, a full waiting queue 429,
a dead engine 503. A request is admitted into the engine before its response starts, so a streamed request gets
these statuses too; an error after the stream started is an error event followed by ``data: [DONE]``.
"""

from __future__ import annotations

import logging
import socket
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged_serve._compat.async_llm_engine import AsyncLLMEngine
from paged_serve._compat.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelList,
    server_schema,
)
from paged_serve._compat.openai.serving_chat import OpenAIServingChat
from paged_serve._compat.openai.serving_completion import OpenAIServingCompletion
from paged_serve._compat.openai.serving_engine import OpenAIError
from paged_serve._compat.prometheus import to_prometheus
from paged_serve._infra import http_server
from paged_serve._infra.api_key import APIKeyMiddleware
from paged_serve._infra.http_server import bind_socket
from paged_serve._infra.request_body import RequestBodyError, read_json

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


_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 415, 429, 500, 503)}


def _post_doc(request_model, response_model) -> dict:
    """A POST route's OpenAPI entry: its JSON body (the route reads the body itself, for the size limit and the
    error shape) and its answers."""
    body = {"$ref": f"#/components/schemas/{request_model.__name__}"}
    extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
    return {"openapi_extra": extra, "responses": {200: {"model": response_model}, **_ERRORS}}


def _openapi(app: FastAPI, limits: dict):
    """FastAPI's document plus the request models (and their parts) under components, with the server's limits."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            models = [(m, "validation") for m in (CompletionRequest, ChatCompletionRequest)]
            _, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            app.openapi_schema = server_schema(schema, limits)
        return app.openapi_schema

    return openapi


def build_app(
    engine: AsyncLLMEngine,
    served_model_name: str | list[str],
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    log_requests: bool = True,
    chat_template: str | None = None,
    chat_template_content_format: str = "auto",
    return_tokens_as_token_ids: bool = False,
) -> FastAPI:
    """The app; ``served_model_name`` is one name or vLLM's list (the first answers, all are accepted)."""
    app = FastAPI(title="paged-serve", redoc_url=None)  # /docs and /openapi.json, as vLLM's server has
    completion = OpenAIServingCompletion(engine, served_model_name, log_requests, return_tokens_as_token_ids)
    chat = OpenAIServingChat(engine, served_model_name, log_requests, chat_template, chat_template_content_format,
                             return_tokens_as_token_ids)  # fmt: skip
    served_model_name = completion.model_name
    created = int(time.time())
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    limits = {"vocab_size": engine.engine.vocab_size, "max_logprobs": engine.engine.model_config.max_logprobs}
    app.openapi = _openapi(app, limits)

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
        try:
            body = await read_json(request, max_request_bytes)
        except RequestBodyError as exc:
            raise OpenAIError(str(exc), exc.status) from None
        try:
            return model.model_validate(body, context=limits)
        except ValidationError as exc:
            message, param = _validation_message(exc.errors())
            raise OpenAIError(message, 400, param=param) from None

    @app.get("/health")
    async def health():
        if engine.errored is not None:
            return PlainTextResponse("engine failed", status_code=503)
        return PlainTextResponse("")

    @app.get("/v1/models", response_model=None, responses={200: {"model": ModelList}})
    async def models():
        max_len = engine.engine.scheduler_config.max_model_len
        cards = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "paged-serve",
                "root": engine.engine.model_config.model,
                "parent": None,
                "max_model_len": max_len,
            }
            for name in completion.model_names  # a card per served name, as vLLM lists them
        ]
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/metrics")
    async def metrics():
        stats = to_prometheus(engine.engine.get_stats(), served_model_name)
        return PlainTextResponse(stats, media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", **_post_doc(CompletionRequest, CompletionResponse))
    async def create_completion(request: Request):
        return await completion.create_completion(await parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions", **_post_doc(ChatCompletionRequest, ChatCompletionResponse))
    async def create_chat_completion(request: Request):
        return await chat.create_chat_completion(await parse(request, ChatCompletionRequest), request)

    return app


def run_server(
    app: FastAPI,
    sock: socket.socket,
    engine: AsyncLLMEngine,
    log_level: str = "info",
    shutdown_timeout: float = 10.0,
) -> None:
    """Serve until SIGTERM / SIGINT; in-flight requests get ``shutdown_timeout`` seconds, then the engine aborts
    them (``_infra/http_server.run_server``); a dead engine stops the server too."""
    failed = lambda: engine.errored is not None  # noqa: E731 - the engine loop died: stop serving
    http_server.run_server(app, sock, engine.abort_all, log_level, shutdown_timeout, failed)


__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "bind_socket", "build_app", "run_server"]
