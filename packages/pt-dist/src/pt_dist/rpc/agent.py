"""The RPC agent: requests out with ids and deadlines, requests in on a thread pool, responses matched back.

torch's ``TensorPipeAgent`` (torch/csrc/distributed/rpc/tensorpipe_agent.cpp) in three parts: ``request``
(encode, register a ``torch.futures.Future`` under a fresh id with its deadline, send), ``_serve`` (decode,
run the op's handler inside the caller's distributed-autograd context, answer) and ``_on_response`` (complete
the Future the id names), plus a watchdog that fails futures past their deadline ("RPC ran for more than set
timeout"). A connection that breaks fails every request waiting on that worker at once, with the reason;
later calls to it fail immediately. A request whose handler returns a Future (``@async_execution``, an RRef
whose value is not ready) is answered when that Future completes, so no pool thread waits on it. Calls to
oneself take the same path without a socket. A request carrying user RRefs their owner has yet to confirm
runs once they are confirmed (torch's ``RequestCallbackImpl`` waits on the same).

The sockets, their readers and the threads are infrastructure (``pt_dist/_infra/rpc_connections.py``,
``rpc_transport.py``, ``rpc_threads.py``): a connection's reader serves the requests it reads itself, and a
Future nobody chained anything to completes on the reader thread (a ``wait`` needs no other hand-off); one
with ``then`` / ``add_done_callback`` callbacks completes on a callback thread, so a callback may block on
another RPC whose answer this reader brings.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback

import torch

from pt_dist._infra.rpc_connections import Connections
from pt_dist._infra.rpc_threads import CallbackThreads, RpcFuture, ThreadPool, Watchdog
from pt_dist._infra.rpc_transport import FLAG_ERROR, REQUEST, RESPONSE, Limits, Message
from pt_dist.autograd import container
from pt_dist.rpc import serialize
from pt_dist.rpc.options import TensorPipeRpcBackendOptions, WorkerInfo

log = logging.getLogger(__name__)


class RpcTimeoutError(RuntimeError):
    """A call past its deadline (a RuntimeError, as torch's): lets an RRef know its creation timed out."""


class RpcAgent:
    """One worker's endpoint: ``request(dst, payload, timeout) -> Future``; handlers serve peers' requests."""

    def __init__(self, name: str, rank: int, world_size: int, store, options: TensorPipeRpcBackendOptions,
                 on_start=lambda agent: None):
        self.info, self.world_size, self.store, self.options = WorkerInfo(name, rank), world_size, store, options
        self.rank = rank
        self.workers = [WorkerInfo(f"rank {r}", r) for r in range(world_size)]  # until the store has the names
        self.handlers: dict[str, object] = {}
        self._lock = threading.Condition()
        self._pending: dict[int, tuple] = {}  # rid -> (future, dst, timeout)
        self._ids = itertools.count(1)
        self.active = 0  # requests being served
        self._completing = 0  # responses taken from the table whose future is being completed
        self.sent = 0  # requests sent (cumulative: the join's quiescence check)
        self.closing = False
        self._pool = ThreadPool(options.num_worker_threads, f"rpc-{name}")
        self._callbacks = CallbackThreads(f"rpc-cb-{name}")
        self._watchdog = Watchdog(f"rpc-watchdog-{rank}", self._expire, self._pending)  # fails calls past deadline
        limits = Limits(options.max_meta_bytes, options.max_message_bytes, options.chunk_bytes)
        self.connections = Connections(rank, world_size, limits, self._serve, self._on_response, self._peer_gone)
        on_start(self)  # handlers, the RRef context, the process's agent: before any peer can reach us
        try:
            workers = self.connections.listen(store, name, options.host)
            self.workers = [WorkerInfo(n, r) for r, (n, _, _) in enumerate(workers)]
            self.connections.connect(workers, time.monotonic() + (options.rpc_timeout or 300.0))
        except BaseException:
            self.close()
            raise

    def _peer_gone(self, peer: int, reason: str) -> None:
        with self._lock:
            failed = [rid for rid, e in self._pending.items() if e[1] == peer]
        (log.warning if failed else log.debug if self.closing else log.info)(
            "rpc %s: connection to %s closed (%s)", self.info, self.workers[peer], reason)
        for rid in failed:
            self._fail(rid, RuntimeError(f"RPC to {self.workers[peer]} failed: its connection closed "
                                         f"({reason}); the worker is gone"))

    def _deliver(self, dst: int, msg: Message) -> None:
        if dst == self.rank:  # a request is served on the pool (a peer's, by its connection's reader)
            msg.tensors = [t.detach().clone() for t in msg.tensors]  # a copy, as a remote call would see
            if msg.kind == REQUEST:
                self.submit(self._serve, dst, msg)
            else:
                self._on_response(dst, msg)
        else:  # a peer still in init_rpc may not have connected yet: wait for it, not fail
            self.connections.send(dst, msg, self.options.rpc_timeout or None)

    # --- outgoing ----------------------------------------------------------------------------------------
    def request(self, dst: int, payload: tuple, timeout: float | None = None, ctx=None) -> torch.futures.Future:
        """Send ``payload`` (an op name and its arguments) to worker ``dst``; the Future holds the answer."""
        timeout = self.options.rpc_timeout if timeout is None or timeout < 0 else float(timeout)
        rid = next(self._ids)
        msg = serialize.encode(payload, dst, self, ctx, REQUEST, rid)
        fut = RpcFuture()
        with self._lock:
            if self.closing:
                raise RuntimeError(f"RPC agent of {self.info} has shut down")
            self._pending[rid] = (fut, dst, timeout)
            self.sent += 1
        if timeout > 0:
            self._watchdog.add(time.monotonic() + timeout, rid)
        try:
            self._deliver(dst, msg)
        except OSError as e:
            self._fail(rid, RuntimeError(f"RPC to {self.workers[dst]} failed: {e}"))
        return fut

    def _claim(self, rid: int):
        """Take request ``rid`` out of the pending table to complete it (None: someone else did)."""
        with self._lock:
            entry = self._pending.pop(rid, None)
            if entry is not None:
                self._completing += 1
            return entry

    def _completed(self) -> None:
        with self._lock:
            self._completing -= 1
            self._lock.notify_all()

    def _fail(self, rid: int, exc: BaseException) -> None:
        entry = self._claim(rid)
        if entry is not None:
            entry[0].complete(self._callbacks, exc=exc)
            self._completed()

    def _on_response(self, src: int, msg: Message) -> None:
        entry = self._claim(msg.rid)
        if entry is None:
            return  # timed out already, or a stray id
        fut = entry[0]
        try:
            value = serialize.decode(msg, src, self)
        except Exception as e:
            fut.complete(self._callbacks, exc=RuntimeError(f"cannot decode the response from {self.workers[src]}: "
                                                           f"{e!r}"))
        else:
            if msg.flags & FLAG_ERROR:
                fut.complete(self._callbacks, exc=serialize.rebuild_error(value))
            else:
                fut.complete(self._callbacks, value)
        finally:
            self._completed()

    def _expire(self, rid: int) -> None:
        """The watchdog's call: request ``rid`` is past its deadline."""
        entry = self._pending.get(rid)
        if entry is not None:
            _, dst, timeout = entry
            self._fail(rid, RpcTimeoutError(
                f"RPC ran for more than set timeout ({int(timeout * 1000)} ms) and will now be marked with an "
                f"error (call to {self.workers[dst]})"))

    # --- incoming ----------------------------------------------------------------------------------------
    def _serve(self, src: int, msg: Message) -> None:
        with self._lock:
            self.active += 1
        ctx, waits = None, []
        try:
            ctx = container.get_or_create(msg.ctx_id, src) if msg.ctx_id >= 0 else None
            with container.current(ctx):
                op, *body = serialize.decode(msg, src, self, waits)
        except BaseException as e:
            self._respond(src, msg, e, ctx, traceback.format_exc())
            return
        if waits:  # RRef arguments not yet confirmed by their owners: run once they are, holding no thread
            torch.futures.collect_all(waits).add_done_callback(
                lambda _: self.submit(self._handle, src, msg, ctx, op, body))
            return
        self._handle(src, msg, ctx, op, body)

    def _handle(self, src: int, msg: Message, ctx, op: str, body) -> None:
        try:
            with container.current(ctx):
                result = self.handlers[op](src, *body)
        except BaseException as e:
            self._respond(src, msg, e, ctx, traceback.format_exc())
            return
        if isinstance(result, torch._C.Future):
            result.add_done_callback(lambda f: self._respond_future(src, msg, f, ctx))
        else:
            self._respond(src, msg, result, ctx)

    def _respond_future(self, src: int, msg: Message, fut, ctx) -> None:
        try:
            value = fut.wait()
        except BaseException as e:
            self._respond(src, msg, e, ctx, traceback.format_exc())
            return
        self._respond(src, msg, value, ctx)

    def _respond(self, src: int, msg: Message, value, ctx, tb: str | None = None) -> None:
        try:
            if tb is not None:
                out = serialize.encode(serialize.error_payload(value, str(self.info), tb), src, self, None,
                                       RESPONSE, msg.rid, FLAG_ERROR)
            else:
                try:
                    out = serialize.encode(value, src, self, ctx, RESPONSE, msg.rid)
                except Exception as e:
                    out = serialize.encode(serialize.error_payload(e, str(self.info), traceback.format_exc()),
                                           src, self, None, RESPONSE, msg.rid, FLAG_ERROR)
            self._deliver(src, out)
        except OSError as e:
            log.debug("rpc %s: could not answer %s: %s", self.info, self.workers[src], e)
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            self.active -= 1
            self._lock.notify_all()

    def submit(self, fn, *args) -> None:
        """Run ``fn`` on the pool (RRef deletes from ``__del__``: never send from inside the garbage collector);
        nothing once the pool has shut down."""
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:
            pass

    # --- quiescence and shutdown -------------------------------------------------------------------------
    def wait_idle(self, deadline: float | None) -> bool:
        """Wait until nothing is pending or being served here; False if ``deadline`` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending and self.active == 0 and not self._completing,
                                       None if deadline is None else max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        with self._lock:
            self.closing = True
            pending, self._pending = self._pending, {}
            self._lock.notify_all()
        self._watchdog.close()
        self.connections.close()
        for fut, dst, _ in pending.values():
            fut.set_exception(RuntimeError(f"RPC agent of {self.info} shut down before {self.workers[dst]} answered"))
        self._pool.shutdown()
