"""``Work``: the handle a collective returns, and the per-group queue that runs collectives in order.

As in c10d (ProcessGroup::Work), ``async_op=True`` returns at once and the collective runs on the
group's background thread; ``wait()`` blocks and re-raises the collective's error; ``get_future()``
gives a ``torch.futures.Future`` resolved with the output tensors (so ``.then`` chains work).
One thread per group keeps every rank issuing collectives in the same order, which all
rendezvous-free collective algorithms depend on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from pt_dist.store import _seconds


class Work:
    """A pending or finished collective."""

    def __init__(self, op_name: str = ""):
        self.op_name = op_name
        self._future: torch.futures.Future = torch.futures.Future()
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._source: int | None = None  # a receive's sender (group rank), once known
        self._runner: OpQueue | None = None  # the queue it waits in, if it was queued

    def _source_rank(self) -> int:
        """The group rank a finished receive came from (torch's name; what ``recv(src=None)`` reports)."""
        self.wait()
        if self._source is None:
            raise ValueError(f"{self.op_name}: only a receive has a source rank")
        return self._source

    def _finish(self, result=None, exc: BaseException | None = None) -> None:
        self._exc = exc
        if exc is None:
            self._future.set_result(result)
        else:
            self._future.set_exception(exc)
        self._done.set()

    def wait(self, timeout=None) -> bool:
        """Block until done; re-raise the collective's error. ``timeout`` (seconds or timedelta) bounds the wait."""
        if timeout is not None:
            timeout = _seconds(timeout)  # (capped as every other timeout: timedelta.max means none)
        if not self._done.is_set() and self._runner is not None and threading.current_thread() is self._runner._thread:
            raise RuntimeError(f"{self.op_name}: waited on from a callback on its own group's thread, which must "
                               f"run it first; issue it from that callback (it then runs inline) or wait elsewhere")
        if not self._done.wait(timeout):
            from pt_dist.errors import DistBackendError

            raise DistBackendError(f"{self.op_name}: Work.wait timed out after {timeout}s")
        if self._exc is not None:
            raise self._exc
        return True

    def synchronize(self) -> None:
        """CPU tensors have no stream to order: the result is ready once the Work is (torch's, for gloo's)."""
        self.wait()

    block_current_stream = synchronize

    def source_rank(self) -> int:
        return self._source_rank()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> list:
        self.wait()
        return self._future.value()

    @classmethod
    def completed(cls, op_name: str, result) -> Work:
        work = cls(op_name)
        work._finish(result)
        return work


class OpQueue:
    """Runs a group's collectives one at a time, in submission order, on one daemon thread.

    A blocking call made while nothing is queued runs inline on the caller's thread (no thread hop,
    which matters for small-message latency); otherwise it queues behind the pending async work. A
    call from the queue's own thread (a ``get_future().then`` callback, as DDP's comm hooks chain them;
    PowerSGD's issues async all-reduces there and waits on their futures), blocking or async, also runs
    inline, right after the op whose callback it is, the same point on every rank; queued behind the
    rest it would wait on the very thread that must run it.
    """

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, op_name: str, fn: Callable[[], object], async_op: bool) -> Work:
        with self._lock:  # (also: threads submitting their first async ops at once start one worker, not several)
            inline = (not async_op and self._pending == 0) or threading.current_thread() is self._thread
            if not inline:
                self._pending += 1
                work = Work(op_name)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=f"pt_dist-{self._name}", daemon=True)
                    self._thread.start()
                self._queue.put((work, fn))
        if inline:
            with self._run_lock:
                if not async_op:
                    return Work.completed(op_name, fn())
                work = Work(op_name)
                try:
                    result = fn()
                except Exception as e:  # noqa: BLE001 - an async op's error is the Work's, as when queued
                    work._finish(exc=e)
                else:
                    work._finish(result)
                return work
        work._runner = self
        if not async_op:
            work.wait()
        return work

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if not isinstance(item, tuple):  # a stop sign
                if item is threading.current_thread():
                    return
                continue
            work, fn = item
            try:
                with self._run_lock:
                    result = fn()
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the Work
                work._finish(exc=e)
            else:
                work._finish(result)
            finally:
                with self._lock:
                    self._pending -= 1

    def shutdown(self) -> None:
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._queue.put(thread)  # stops that worker (only: a stale one left by a second call stops no other)
        thread.join(timeout=5)  # (meanwhile a blocking call from one of its callbacks still runs inline)
        with self._lock:
            if self._thread is thread:
                self._thread = None
