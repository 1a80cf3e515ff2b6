"""What the completion and chat endpoints share (vLLM ``serving_engine.OpenAIServing``): request checks, errors,
prompt tokenisation, context-length limits, and iterating an engine stream that stops when the client leaves."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from paged_serve.engine.async_llm_engine import AsyncLLMEngine
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams


class OpenAIError(Exception):
    """An error answered with OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def sse(payload: dict | str) -> str:
    """One server-sent event."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_name: str):
        self.engine = engine
        self.model_name = served_model_name
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.scheduler_config.max_model_len

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    @staticmethod
    def created() -> int:
        return int(time.time())

    def check_length(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        """The request's max_tokens, checked against the context (None: whatever is left of it)."""
        if not prompt_ids:
            raise OpenAIError("the prompt is empty", param="prompt")
        room = self.max_model_len - len(prompt_ids)
        if room <= 0:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                f"{len(prompt_ids)} tokens.",
                param="prompt",
            )
        if max_tokens is None:
            return room
        if max_tokens < 1:
            raise OpenAIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if max_tokens > room:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} in the "
                "completion). Please reduce the length of the prompt or completion.",
                param="max_tokens",
            )
        return max_tokens

    @staticmethod
    def make_params(request, max_tokens: int, logprobs: int | None) -> SamplingParams:
        try:
            return request.sampling_params(max_tokens, logprobs)
        except ValueError as exc:
            raise OpenAIError(str(exc)) from None

    def check_ids(self, ids: list[int]) -> list[int]:
        vocab = self.engine.engine.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise OpenAIError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt")
        return ids

    async def stream(self, raw: Request, request_id: str, prompt, params, ids) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request; aborted (blocks freed) as soon as the client disconnects."""
        gen = self.engine.generate(request_id, prompt, params, ids)
        nxt = None
        try:
            while True:
                nxt = asyncio.ensure_future(gen.__anext__())
                while True:
                    done, _ = await asyncio.wait({nxt}, timeout=0.25)
                    if done:
                        break
                    if await raw.is_disconnected():
                        return
                try:
                    output = nxt.result()
                except StopAsyncIteration:
                    return
                nxt = None
                yield output
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
                try:
                    await nxt  # let the generator see the cancellation and abort the request
                except (asyncio.CancelledError, StopAsyncIteration):
                    pass
            await gen.aclose()
