"""``AsyncLLMEngine`` (vLLM ``engine/async_llm_engine.py``): the engine loop for a server, one stream per request.

The ``LLMEngine`` is driven by one background thread, which alone touches it: coroutines hand it ``add`` and
``abort`` commands through a thread-safe queue, and it pushes each request's ``RequestOutput`` s back into that
request's asyncio queue. Waiting requests are bounded (``max_waiting_requests``): past it ``add_request`` raises
``QueueFullError`` at once (the server answers 429) instead of letting the queue grow without bound.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator

from paged_serve.engine.arg_utils import EngineArgs
from paged_serve.engine.llm_engine import LLMEngine
from paged_serve.outputs import RequestOutput
from paged_serve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests are waiting for a place in the batch."""


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

    async def generate(
        self,
        request_id: str,
        prompt: str | None,
        params: SamplingParams,
        prompt_token_ids: list[int] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs as the engine produces them; abort it if the consumer leaves."""
        if self.errored is not None:
            raise RuntimeError(f"the engine loop died: {self.errored!r}")
        stream: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self.num_waiting() >= self.max_waiting_requests:
                raise QueueFullError(f"{self.num_waiting()} requests are waiting (max_waiting_requests)")
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
            self._pending += 1
        self._commands.put(("add", request_id, prompt, params, prompt_token_ids))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
        self._commands.put(("abort", request_id))
        self._wake.set()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------ engine side
    def _deliver(self, request_id: str, item) -> None:
        with self._lock:
            target = self._streams.get(request_id)
            if target is not None and (isinstance(item, BaseException) or item.finished):
                del self._streams[request_id]
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, rid, prompt, params, ids = command
                with self._lock:
                    self._pending -= 1
                    wanted = rid in self._streams
                if not wanted:  # aborted before it reached the engine
                    continue
                try:
                    self.engine.add_request(rid, prompt=prompt, params=params, prompt_token_ids=ids)
                except Exception as exc:  # a bad request fails alone
                    self._deliver(rid, exc)
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
