"""What the completion and chat endpoints share (vLLM ``serving_engine.OpenAIServing``): request checks, errors,
prompt tokenisation off the event loop, context-length limits, admission before the response starts, and
iterating an engine stream that is aborted when the client leaves."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from paged_serve._compat.async_llm_engine import AsyncLLMEngine, QueueFullError, RequestAbortedError, RequestStream
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An error answered with OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def _piece(tokenizer, window: list[int], prefix_text: str, skip: bool, flush: bool) -> str | None:
    """The text ``window``'s last token adds after ``prefix_text``; ``None`` while it ends inside a character."""
    text = tokenizer.decode(window, skip_special_tokens=skip)
    if not flush and (len(text) <= len(prefix_text) or text.endswith("\ufffd")):
        return None
    return text[len(prefix_text) :]


def token_texts(tokenizer, token_ids, logprobs, context=(), skip: bool = True, final: bool = True) -> list[tuple]:
    """Per token, ``(its share of the decoded text, {alternative id: its text})``, decoded after ``context``'s
    last ids as vLLM's ``detokenize_incrementally`` does (``logprobs`` entries may be None: no alternatives).

    A character split over byte-level tokens comes whole with the token that completes it; the tokens before are
    ``None`` (vLLM's logprobs processor corrects their lone decodes, "\ufffd", to "" and the completing token's to
    the character); ``final`` gives an unfinished character's bytes to the last token, as the output text has them.
    ``context`` must end on a whole character. The alternatives at a position are decoded after the same context.
    """
    ids = list(context)[-5:]
    prefix, read = 0, len(ids)
    prefix_text = tokenizer.decode(ids, skip_special_tokens=skip)
    out = []
    for k, (token_id, lps) in enumerate(zip(token_ids, logprobs)):
        window = ids[prefix:]
        ids.append(token_id)
        last = final and k == len(token_ids) - 1
        text = _piece(tokenizer, window + [token_id], prefix_text, skip, last)
        alternatives = {t: _piece(tokenizer, window + [t], prefix_text, skip, last) or "" for t in lps or ()}
        out.append((text, alternatives))
        if text is not None:
            prefix, read = read, len(ids)
            prefix_text = tokenizer.decode(ids[prefix:read], skip_special_tokens=skip)
    return out


def sse(payload: dict | str) -> str:
    """One server-sent event."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_name: str | list[str], log_requests: bool = True,
                 return_tokens_as_token_ids: bool = False):  # fmt: skip
        """``served_model_name``: the name responses carry, or vLLM's list of them (the first is answered with,
        every one is accepted); ``log_requests=False`` is ``--disable-log-requests``; ``return_tokens_as_token_ids``
        names logprobs tokens "token_id:<id>" unless a request says otherwise (vLLM's flag and request field)."""
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name)
        self.engine = engine
        self.model_name, self.model_names = names[0], names
        self.log_requests = log_requests
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.scheduler_config.max_model_len
        # what the model's generation config sets, for the fields a request leaves out (vLLM's serving classes)
        self.default_sampling_params = engine.engine.model_config.get_diff_sampling_param()
        if self.default_sampling_params:
            logger.info("sampling defaults from the model's generation config: %s", self.default_sampling_params)

    def token_id_names(self, request) -> bool:
        given = request.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids if given is None else given

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    @staticmethod
    def created() -> int:
        return int(time.time())

    def check_length(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        """The request's max_tokens, checked against the context (None: whatever is left of it, at most the
        generation config's ``max_new_tokens``)."""
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
            return min(room, self.default_sampling_params.get("max_tokens", room))
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

    def make_params(self, request, max_tokens: int, logprobs: int | None) -> SamplingParams:
        try:
            return request.sampling_params(max_tokens, logprobs, self.default_sampling_params)
        except ValueError as exc:
            raise OpenAIError(str(exc)) from None

    def check_ids(self, ids: list[int]) -> list[int]:
        vocab = self.engine.engine.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise OpenAIError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt")
        return ids

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize in a worker thread: a long prompt must not stall every other client on the event loop."""
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)

    async def admit(self, requests: list[tuple]) -> list[RequestStream]:
        """Put every prompt of one API request into the engine, or none: the errors a client must see as a status
        (429 full queue, 400 bad value, 503 dead engine) are raised here, before any response byte is sent."""
        try:
            return await self.engine.add_requests(requests)
        except QueueFullError as exc:
            raise OpenAIError(f"server overloaded: {exc}", 429, "rate_limit_exceeded") from None
        except ValueError as exc:
            raise OpenAIError(str(exc), 400) from None
        except RuntimeError as exc:
            raise OpenAIError(str(exc), 503, "service_unavailable") from None

    def log_request(self, request, request_id: str) -> None:
        ignored = request.ignored_fields()
        if ignored:
            logger.warning("request %s: fields %s are accepted but have no effect here", request_id, ignored)
        if not self.log_requests:
            return
        fields = request.model_dump(exclude_none=True, exclude={"messages", "prompt"})
        logger.info("received request %s (user %r): %s", request_id, request.user, fields)

    @staticmethod
    async def outputs(raw: Request, stream: RequestStream) -> AsyncIterator[RequestOutput]:
        """One request's outputs; it is aborted (blocks freed) once the client disconnects, waiting or running."""
        try:
            while True:
                nxt = asyncio.ensure_future(stream.__anext__())
                try:
                    while True:
                        done, _ = await asyncio.wait({nxt}, timeout=0.25)
                        if done:
                            break
                        if await raw.is_disconnected():
                            return
                finally:
                    if not nxt.done():
                        nxt.cancel()
                try:
                    output = nxt.result()
                except StopAsyncIteration:
                    return
                except RequestAbortedError as exc:
                    raise OpenAIError(str(exc), 503, "service_unavailable") from None
                except RuntimeError as exc:  # the engine loop failed: every request in it fails
                    raise OpenAIError(str(exc), 500, "internal_server_error") from None
                yield output
        finally:
            stream.close()

    async def final_outputs(self, raw: Request, streams: list[RequestStream]) -> list[RequestOutput]:
        """Every stream's last output, for a non-streamed answer; all are aborted if the client leaves."""

        async def last(stream):
            final = None
            async for output in self.outputs(raw, stream):
                final = output
            return final if final is not None and final.finished else None

        try:
            finals = await asyncio.gather(*(last(s) for s in streams))
        finally:
            for s in streams:
                s.close()
        if any(f is None for f in finals):
            raise OpenAIError("the client disconnected", 499)
        return finals


async def guard_stream(events: AsyncIterator[str], streams: list[RequestStream]) -> AsyncIterator[str]:
    """Server-sent events of an admitted request. An error after the stream started is sent as an OpenAI error
    event and ``data: [DONE]`` (as vLLM does), and every request is aborted when the stream ends or is dropped."""
    try:
        async for event in events:
            yield event
    except Exception as exc:  # noqa: BLE001 - the client must hear about it in the stream
        logger.warning("stream failed after it started: %r", exc)
        status = exc.status if isinstance(exc, OpenAIError) else 500
        kind = exc.kind if isinstance(exc, OpenAIError) else "internal_server_error"
        yield sse({"error": {"message": str(exc), "type": kind, "param": None, "code": status}})
        yield sse("[DONE]")
    finally:
        for s in streams:
            s.close()
