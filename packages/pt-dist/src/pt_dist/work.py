"""``Work``: the handle a collective returns, and the per-group queue that runs collectives in order.

As in c10d (ProcessGroup::Work), ``async_op=True`` returns at once and the collective runs on the
group's background thread; ``wait()`` blocks and re-raises the collective's error; ``get_future()``
gives a ``torch.futures.Future`` resolved with the output tensors (so ``.then`` chains work).
One thread per group keeps every rank issuing collectives in the same order, which all
rendezvous-free collective algorithms depend on. Point-to-point Works finish on their channel's threads,
and their futures' callbacks run on threads of their own (``ChannelWork``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch

from pt_dist._infra.store import _seconds

logger = logging.getLogger(__name__)


class _WorkFuture(torch.futures.Future):
    """The future ``get_future()`` returns: its ``wait()`` first lets the Work help itself along, as ``Work.wait``
    does (a then-callback on the group's thread waiting on an op queued behind it runs that op first).

    Futures chained from it with ``then`` are of this kind too and help the same Work along: torch's gloo runs
    a later op on its second thread while a callback waits for that op's chained future; here the waiting
    callback runs the group's queue up to that op itself, so the order stays the one every rank issued."""

    def __init__(self, work: Work | None = None, ref: weakref.ref | None = None):
        super().__init__()
        self._work = ref or weakref.ref(work)  # no cycle: the Work and its tensors go with their last reference

    def wait(self):
        work = self._work()
        if work is not None and not self.done():
            work._before_blocking()
        return super().wait()

    def add_done_callback(self, callback):
        """A callback on the group's thread attaching to a later op's future may go on to wait for it by means this
        future cannot see (an Event its callback sets): the queue runs up to that op first, as for ``wait``."""
        self._help_along()
        super().add_done_callback(callback)

    def _help_along(self) -> None:
        work = self._work()
        if work is not None and not self.done():
            work._before_blocking()  # (only on the group's own thread; anywhere else nothing happens)

    def then(self, callback):
        self._help_along()
        child = _WorkFuture(ref=self._work)

        def go(fut):
            try:
                child.set_result(callback(fut))
            except BaseException as e:  # noqa: BLE001 - the chained future's error, as torch's then
                child.set_exception(e)
        torch.futures.Future.add_done_callback(self, go)
        return child


_transport = threading.local()
_worker = threading.local()


def on_group_thread() -> bool:
    """Whether this thread is a group's worker, running collectives issued with ``async_op=True``: the caller
    computes meanwhile and needs the GIL between its kernels, so waits here should sleep rather than spin."""
    return getattr(_worker, "active", False)


def callbacks_elsewhere() -> None:
    """Called once by a transport's own thread (a p2p channel's reader or sender): callbacks of the futures it
    finishes then run on threads of their own, since a callback may wait on a transfer only this thread makes
    (a blocking receive from the same peer in an ``irecv`` callback)."""
    _transport.busy = True


def _off_transport(fn):
    def run(fut):
        if getattr(_transport, "busy", False):
            threading.Thread(target=fn, args=(fut,), name="pt_dist-callback", daemon=True).start()
        else:
            fn(fut)
    return run


class _ChannelFuture(_WorkFuture):
    """A point-to-point Work's future: ``then`` and ``add_done_callback`` callbacks never run on the channel's
    thread. (Its Works finish there, at once: a thread hop for every transfer would cost latency.)"""

    def then(self, callback):
        child = torch.futures.Future()

        def go(fut):
            try:
                child.set_result(callback(fut))
            except BaseException as e:  # noqa: BLE001 - the chained future's error, as torch's then
                child.set_exception(e)
        super().add_done_callback(_off_transport(go))
        return child

    def add_done_callback(self, callback):
        def go(fut):
            try:
                callback(fut)
            except Exception:  # logged and dropped, as torch's
                logger.exception("pt_dist: a future's done callback raised")
        super().add_done_callback(_off_transport(go))


class Work:
    """A pending or finished collective."""

    _future_type: type = _WorkFuture
    _streams = False  # True where wait() must also order the caller's CUDA stream (torch's NCCL Works)

    def __init__(self, op_name: str = ""):
        self.op_name = op_name
        self._future: torch.futures.Future = self._future_type(self)
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._source: int | None = None  # a receive's sender (group rank), once known
        # called before a wait blocks: it may finish the Work on this thread (the group's queue runs up to it)
        self._blocker: Callable[[Work, float | None], None] | None = None
        self._finishing: threading.Thread | None = None  # the thread running the future's callbacks

    def _source_rank(self) -> int:
        """The group rank a finished receive came from (torch's name; what ``recv(src=None)`` reports)."""
        self.wait()
        if self._source is None:
            raise ValueError(f"{self.op_name}: only a receive has a source rank")
        return self._source

    def _finish(self, result=None, exc: BaseException | None = None) -> None:
        """The future first (its callbacks run here), then ``wait()`` returns, as c10d's Work."""
        self._exc = exc
        self._finishing = threading.current_thread()
        if exc is None:
            self._future.set_result(result)
        else:
            self._future.set_exception(exc)
        self._done.set()

    def _before_blocking(self, timeout: float | None = None) -> None:
        if self._blocker is not None:
            self._blocker(self, timeout)

    def wait(self, timeout=None) -> bool:
        """Block until done; re-raise the collective's error. ``timeout`` (seconds or timedelta) bounds the wait;
        zero means none, as torch's default ``timedelta(0)`` (``kNoTimeout``)."""
        if timeout is not None:
            timeout = _seconds(timeout) or None  # (capped as every other timeout: timedelta.max means none)
        if not self._done.is_set():
            if self._finishing is threading.current_thread():  # from a callback of its own future: the outcome is
                if self._exc is not None:  # known, though the Work completes only after its callbacks (c10d hangs)
                    raise self._exc
                return True
            self._before_blocking(timeout)
        if not self._done.wait(timeout):
            from pt_dist._infra.errors import DistBackendError

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
    which matters for small-message latency); otherwise it queues behind the pending async work. Callbacks
    of a queued op's future run on the queue's thread as the op finishes. A call from there (a
    ``get_future().then`` callback, as DDP's comm hooks chain them; PowerSGD's issues async all-reduces there
    and waits on their futures), blocking or async, runs inline, right after the op whose callback it is: the
    same point on every rank, provided the callback was attached before the rank issued its next op (as a comm
    hook does). A wait there on an op still queued runs the queue up to it first, in order; either way the
    thread never waits on itself.
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
                work._blocker = self._run_until
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
        if not async_op:
            work.wait()
        return work

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def _run(self, work: Work, fn: Callable[[], object]) -> None:
        try:
            with self._run_lock:
                result = fn()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the Work
            work._finish(exc=e)
        else:
            work._finish(result)  # (its callbacks run here, on this thread)
        finally:
            with self._lock:
                self._pending -= 1

    def _loop(self) -> None:
        _worker.active = True
        while True:
            item = self._queue.get()
            if not isinstance(item, tuple):  # a stop sign
                if item is threading.current_thread():
                    return
                continue
            self._run(*item)
            item = None  # hold no caller's tensor while idle

    def _run_until(self, work: Work, timeout: float | None = None) -> None:
        """A wait from a callback on this queue's thread: run the ops queued up to ``work`` here, in order (no
        new one past the wait's ``timeout``: the rest run later, on this thread, as usual)."""
        if threading.current_thread() is not self._thread:
            return
        stops, deadline = [], None if timeout is None else time.monotonic() + timeout
        while not work._done.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                item = self._queue.get_nowait()
            except queue.Empty:  # (not queued here after all: the wait goes on as usual)
                break
            if isinstance(item, tuple):
                self._run(*item)
            else:
                stops.append(item)  # a shutdown asked meanwhile: it still comes after the queued ops
        for stop in stops:
            self._queue.put(stop)

    def shutdown(self) -> None:
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._queue.put(thread)  # stops that worker (only: a stale one left by a second call stops no other)
        if thread is not threading.current_thread():  # (a callback on it may shut its own group down)
            thread.join(timeout=5)  # (meanwhile a blocking call from one of its callbacks still runs inline)
        with self._lock:
            if self._thread is thread:
                self._thread = None



class ChannelWork(Work):
    """A send or receive: finished on its channel's thread, its future's callbacks run elsewhere."""

    _future_type = _ChannelFuture
