"""``AsyncLLMEngine`` (vLLM ``engine/async_llm_engine.py``): the engine loop for a server, one stream per request.

The ``LLMEngine`` is driven by one background thread, which alone touches it: coroutines hand it ``add`` and
``abort`` commands through a thread-safe queue, and it pushes each request's ``RequestOutput`` s back into that
request's ``RequestStream``. Requests are checked and tokenized (``LLMEngine.process_request``, in a worker
thread) before they are queued, so ``add_requests`` raises for a bad one and a server can answer 400 before it
starts a response. Waiting requests are bounded (``max_waiting_requests``): past it ``add_requests`` raises
``QueueFullError`` (the server answers 429; checked after the request's own checks, so a bad request is a 400 in any
state) instead of letting the queue grow without bound.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator

from paged_serve._compat.arg_utils import EngineArgs
from paged_serve.engine.llm_engine import LLMEngine
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests are waiting for a place in the batch."""


class RequestAbortedError(RuntimeError):
    """The server aborted the request (shutting down) before it finished."""


class RequestStream:
    """One admitted request's outputs, as an async iterator; ``close`` (or leaving early) aborts the request."""

    def __init__(self, engine: AsyncLLMEngine, request_id: str):
        self.engine, self.request_id = engine, request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def close(self) -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int = 256):
        if max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()  # guards _streams and the waiting count seen by add_request
        self._pending = 0  # added but not yet handed to the engine
        self._wake = threading.Event()
        self._stop = False
        self.errored: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="paged-serve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, max_waiting_requests: int = 256) -> AsyncLLMEngine:
        return cls(LLMEngine.from_engine_args(engine_args), max_waiting_requests)

    # --------------------------------------------------------- coroutine side
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + self._pending

    async def add_requests(self, requests: list[tuple]) -> list[RequestStream]:
        """Admit ``(request_id, prompt, params, prompt_token_ids)`` requests all together or not at all.

        Everything that can fail fails here, before a server has answered anything, in vLLM's order (every check
        before the engine sees the request): a dead engine (RuntimeError), more prompts than the waiting bound could
        ever hold (ValueError), a bad value (``ValueError`` from ``LLMEngine.process_request``, run off the event
        loop since it tokenizes), then a full queue (``QueueFullError``, worth a retry). The returned streams yield
        each request's outputs; closing one aborts its request.
        """
        if self.errored is not None:
            raise RuntimeError(f"the engine loop died: {self.errored!r}")
        if len(requests) > self.max_waiting_requests:
            raise ValueError(
                f"{len(requests)} prompts in one request can never fit the waiting queue "
                f"(max_waiting_requests={self.max_waiting_requests})"
            )
        processed = []  # checked before the queue's room: a request that can never succeed is a 400 in any state
        for _, prompt, params, ids in requests:
            processed.append(await asyncio.to_thread(self.engine.process_request, prompt, params, ids))
        loop = asyncio.get_running_loop()
        streams = []
        with self._lock:
            self._check_room(len(requests))
            for rid, *_ in requests:
                if rid in self._streams:
                    raise ValueError(f"request id {rid!r} is already in use")
            for (rid, *_), request in zip(requests, processed):
                stream = RequestStream(self, rid)
                self._streams[rid] = (loop, stream.queue)
                self._pending += 1
                self._commands.put(("add", rid, request))
                streams.append(stream)
        self._wake.set()
        return streams

    def _check_room(self, count: int) -> None:
        if self.num_waiting() + count > self.max_waiting_requests:
            raise QueueFullError(f"{self.num_waiting()} requests are waiting (max_waiting_requests)")

    async def generate(
        self,
        request_id: str,
        prompt,
        params: SamplingParams,
        prompt_token_ids: list[int] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs as the engine produces them; abort it if the consumer leaves."""
        (stream,) = await self.add_requests([(request_id, prompt, params, prompt_token_ids)])
        try:
            async for output in stream:
                yield output
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
        self._commands.put(("abort", request_id))
        self._wake.set()

    def abort_all(self, reason: str) -> None:
        """Abort every request, waiting or running; their streams end with ``RequestAbortedError(reason)``."""
        self._commands.put(("abort_all", reason))
        self._wake.set()

    def shutdown(self) -> None:
        """Stop the engine thread; requests still in it are aborted (their blocks freed), their streams told; then
        the engine shuts down (``LLMEngine.shutdown``)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            logger.warning("the engine thread did not stop within 10 s")
            return
        self._run_commands()
        self.engine.abort_request(list(self.engine.requests))
        with self._lock:
            streams = list(self._streams)
        for rid in streams:
            self._deliver(rid, RequestAbortedError("the server is shutting down"))
        self.engine.shutdown()  # the model, the KV cache (and any workers) freed

    # ------------------------------------------------------------ engine side
    def _deliver(self, request_id: str, item) -> None:
        with self._lock:
            target = self._streams.get(request_id)
            if target is not None and (isinstance(item, BaseException) or item.finished):
                del self._streams[request_id]
        if target is not None:
            loop, stream = target
            try:
                loop.call_soon_threadsafe(stream.put_nowait, item)
            except RuntimeError:  # its event loop is closed: nobody is listening any more
                pass

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, rid, request = command
                with self._lock:
                    self._pending -= 1
                    wanted = rid in self._streams
                if not wanted:  # aborted before it reached the engine
                    continue
                try:
                    self.engine.add_processed_request(rid, request)
                except Exception as exc:  # a bad request fails alone
                    self._deliver(rid, exc)
            elif command[0] == "abort_all":
                self.engine.abort_request(list(self.engine.requests))
                with self._lock:
                    streams = list(self._streams)
                for rid in streams:
                    self._deliver(rid, RequestAbortedError(command[1]))
            else:
                self.engine.abort_request(command[1])

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._run_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                for output in self.engine.step():
                    self._deliver(output.request_id, output)
        except BaseException as exc:  # noqa: BLE001 - every waiting client must hear about it
            logger.exception("engine loop failed")
            self.errored = exc
            with self._lock:
                streams = list(self._streams)
            for rid in streams:
                self._deliver(rid, RuntimeError(f"engine loop failed: {exc!r}"))
