"""The RPC agent's threads: the pool that serves requests, the callback threads, and the Future that picks one.

torch's ``TensorPipeAgent`` runs requests and completes futures on its ``threadPool_``. Here requests go to a
fixed pool (``num_worker_threads``, as torch's); a response completes its ``RpcFuture`` on the reader thread
when nothing was chained to it (a ``wait`` needs no further hand-off, so an empty call pays no extra wake-up),
and on the callback threads when something was: a ``then`` callback may block on another RPC, whose answer
the same reader must be free to read (torch's ``test_callback_with_ret``). Callback threads grow while all are
busy, so callbacks waiting on each other cannot starve, and shrink when idle.

A connection's reader serves the requests it reads itself (no hand-off to the pool: one thread wake-up less per
call). While it does, nobody reads that connection, so it must not block for long: ``ReadingRole`` lets another
thread take the reading over, which happens the moment the handler waits on an ``RpcFuture`` (a nested call whose
answer may come on this very connection) and, for any other wait, once the handler has run for
``TAKEOVER_S`` (rpc_connections.py).
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
import traceback

import torch

log = logging.getLogger(__name__)

TAKEOVER_S = 0.01  # a request served on its reader longer than this gets another thread to read on
_inline = threading.local()  # .handoff: set while this thread serves a request it read itself


class RpcFuture(torch.futures.Future):
    """The Future of one request: notes whether callbacks were chained to it, under a lock, so the agent
    completes it inline when none were and on a callback thread when some were (``complete``)."""

    def __init__(self):
        super().__init__()
        self._cb_lock = threading.Lock()
        self._has_callbacks = False

    def add_done_callback(self, callback) -> None:
        with self._cb_lock:
            self._has_callbacks = True
        super().add_done_callback(callback)

    def then(self, callback):
        """As torch's ``then``; the child is an ``RpcFuture`` too, so waiting on it also hands reading over. A
        callback's error reaches the child as torch's: a RuntimeError naming it, with the callback's frames."""
        if not callable(callback):
            raise TypeError(f"then(): incompatible function arguments: takes a callable, got {callback!r}")
        child = RpcFuture()

        def run(fut):
            try:
                child.set_result(callback(fut))
            except Exception as e:
                frames = "".join(f"  {f.filename}({f.lineno}): {f.name}\n"
                                 for f in reversed(traceback.extract_tb(e.__traceback__)[1:]))
                child.set_exception(RuntimeError(f"Got the following error when running the callback: "
                                                 f"{type(e).__name__}: {e}" + (f"\n\nAt:\n{frames}" if frames else "")))

        self.add_done_callback(run)
        return child

    def complete(self, callbacks: CallbackThreads, value=None, exc: BaseException | None = None) -> None:
        """Set the result (or ``exc``) here if no callback was chained to this Future, else on a ``callbacks``
        thread, so a callback that blocks on another RPC does not hold the thread that reads its answer."""
        with self._cb_lock:
            if not self._has_callbacks:
                settle(self, value, exc)
                return
        callbacks.submit(settle, self, value, exc)

    def wait(self):
        """As torch's; a reader serving a request hands its connection's reading over before it blocks."""
        handoff = getattr(_inline, "handoff", None)
        if handoff is not None and not self.done():
            _inline.handoff = None
            handoff()
        return super().wait()


class ReadingRole:
    """Which thread reads one connection: the holder of the current ``role`` number. ``serving`` marks the
    holder serving a request it read; ``take`` moves the role on (the old holder stops reading when it is done)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.role, self.serving_since = 0, None

    def serve(self, handoff) -> int:
        with self._lock:
            self.serving_since = time.monotonic()
            _inline.handoff = handoff
            return self.role

    def served(self, role: int) -> bool:
        """The request is answered; True if this thread still reads the connection."""
        _inline.handoff = None
        with self._lock:
            if self.role != role:
                return False
            self.serving_since = None
            return True

    def take(self, role: int | None = None, older_than: float = 0.0) -> bool:
        """Move the role on if its holder is serving (role ``role``, for ``older_than`` seconds at least)."""
        with self._lock:
            since = self.serving_since
            if since is None or (role is not None and role != self.role) or time.monotonic() - since < older_than:
                return False
            self.role += 1
            self.serving_since = None
            return True


class CallbackThreads:
    """Threads that run completions with callbacks: one more is started whenever all are busy (a callback
    may block on an RPC whose completion needs another), and one idle for ``idle_s`` exits."""

    def __init__(self, name: str, idle_s: float = 10.0):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = self._n = 0
        self._name, self._idle_s = name, idle_s

    def submit(self, fn, *args) -> None:
        with self._lock:
            start = self._idle == 0
            if start:
                self._n += 1
            else:
                self._idle -= 1  # claimed: the put below wakes one
        self._q.put((fn, args))
        if start:
            threading.Thread(target=self._run, name=f"{self._name}-{self._n}", daemon=True).start()

    def _run(self) -> None:
        job = self._q.get()
        while True:
            try:
                job[0](*job[1])
            except Exception:
                log.exception("rpc callback raised")
            job = None
            with self._lock:
                self._idle += 1
            try:
                job = self._q.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody claimed this thread meanwhile
                        self._idle -= 1
                        self._n -= 1
                        return
                job = self._q.get()  # a submit claimed it just as it timed out: its job is on its way


class ThreadPool:
    """The agent's thread pool (TensorPipeAgent's ``threadPool_``): daemon threads on one queue, so a handler that
    never returns cannot hold the interpreter at exit, and a submit costs one queue put."""

    def __init__(self, n: int, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._n, self.stopped = n, False
        for i in range(n):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            if not self.stopped:
                try:
                    job[0](*job[1])
                except Exception:
                    log.exception("rpc pool: a job raised")
            job = None  # an idle thread holds nothing (a job's arguments may hold RRefs)

    def submit(self, fn, *args) -> None:
        if self.stopped:
            raise RuntimeError("the RPC agent's pool has shut down")
        self._q.put((fn, args))

    def shutdown(self) -> None:
        self.stopped = True
        for _ in range(self._n):
            self._q.put(None)


def settle(fut, value, exc) -> None:
    """Complete ``fut`` with ``value``, or with ``exc`` when it is not None."""
    fut.set_result(value) if exc is None else fut.set_exception(exc)


class Watchdog:
    """Calls ``expire(key)`` once the deadline of ``add(deadline, key)`` has passed: torch's agent's timeout
    thread. Keys no longer in ``live`` (answered requests) stay in the heap until their deadline comes up, and
    are dropped when they outnumber the live ones."""

    def __init__(self, name: str, expire, live: dict):
        self._heap: list[tuple[float, int]] = []
        self._cv = threading.Condition(threading.Lock())
        self._expire, self._live, self._closed = expire, live, False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def add(self, deadline: float, key: int) -> None:
        with self._cv:  # wake the thread only for a deadline earlier than all it waits for
            heapq.heappush(self._heap, (deadline, key))
            if self._heap[0][1] == key:
                self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._closed:
                    return
                now, due = time.monotonic(), []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[1])
                if not due:
                    if len(self._heap) > 2 * len(self._live) + 1024:
                        self._heap = [e for e in self._heap if e[1] in self._live]
                        heapq.heapify(self._heap)
                    self._cv.wait(min(self._heap[0][0] - now, 1.0) if self._heap else 1.0)
                    continue
            for key in due:
                self._expire(key)
