"""The RPC agent: requests out with ids and deadlines, requests in on a thread pool, responses matched back.

torch's ``TensorPipeAgent`` (torch/csrc/distributed/rpc/tensorpipe_agent.cpp) in three parts: ``request``
(encode, register a ``torch.futures.Future`` under a fresh id with its deadline, send), one reader per
connection (it serves a request itself, handing the reading to another thread when the request waits; a
response completes its future), and a watchdog that fails futures past their deadline ("RPC ran for more than
set timeout") and hands on the reading of a connection whose reader has served one request too long. A
connection that breaks fails every request waiting on that worker at once, with the reason; later calls to it
fail immediately. A request
whose handler returns a Future (``@async_execution``, an RRef whose value is not ready) is answered when that
Future completes, so no pool thread waits on it. Calls to oneself take the same path without a socket.
A Future nobody chained anything to completes on the reader thread (a ``wait`` needs no other hand-off); one
with ``then`` / ``add_done_callback`` callbacks completes on a callback thread, so a callback may block on
another RPC whose answer this reader brings (threads.py). A request carrying user RRefs their owner has yet
to confirm runs once they are confirmed (torch's ``RequestCallbackImpl`` waits on the same).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import traceback

import torch

from pt_dist.rpc import mesh, serialize
from pt_dist.rpc.options import TensorPipeRpcBackendOptions, WorkerInfo
from pt_dist.rpc.threads import TAKEOVER_S, CallbackThreads, ReadingRole, RpcFuture, ThreadPool, settle
from pt_dist.rpc.transport import FLAG_ERROR, REQUEST, RESPONSE, Connection, Limits, Message

log = logging.getLogger(__name__)


class RpcTimeoutError(RuntimeError):
    """A call past its deadline (a RuntimeError, as torch's): lets an RRef know its creation timed out."""


class RpcAgent:
    """One worker's endpoint: ``request(dst, payload, timeout) -> Future``; handlers serve peers' requests."""

    def __init__(self, name: str, rank: int, world_size: int, store, options: TensorPipeRpcBackendOptions,
                 register=lambda agent: None):
        self.info, self.world_size, self.store, self.options = WorkerInfo(name, rank), world_size, store, options
        self.rank = rank
        self.workers = [WorkerInfo(f"rank {r}", r) for r in range(world_size)]  # until the store has the names
        self.limits = Limits(options.max_meta_bytes, options.max_message_bytes, options.chunk_bytes)
        self.handlers: dict[str, object] = {}
        self._lock = threading.Condition()
        self._peers: dict[int, Connection] = {}
        self._gone: dict[int, str] = {}
        self._pending: dict[int, tuple] = {}  # rid -> (future, dst, timeout)
        self._deadlines: list[tuple[float, int]] = []  # (deadline, request id), a heap: the watchdog's
        self._watch_cv = threading.Condition(threading.Lock())
        self._ids = itertools.count(1)
        self.active = 0  # requests being served
        self._completing = 0  # responses taken from the table whose future is being completed
        self.sent = 0  # requests sent (cumulative: the join's quiescence check)
        self.closing = False
        self._pool = ThreadPool(options.num_worker_threads, f"rpc-{name}")
        self._callbacks = CallbackThreads(f"rpc-cb-{name}")
        from pt_dist.rpc.rref_context import RRefContext

        self.rrefs = RRefContext(self)
        from pt_dist.rpc import handlers

        handlers.install(self)
        register(self)  # the process's agent (api._agent) before any peer can reach us: handlers call rpc
        secret = mesh.job_secret(store, rank)
        self.listener = mesh.Listener(options.host, secret, rank, world_size, self._adopt)
        mesh.publish(store, rank, name, options.host, self.listener.port)
        workers = mesh.gather(store, world_size)
        self.workers = [w for w, _, _ in workers]
        deadline = time.monotonic() + (options.rpc_timeout or 300.0)
        for info, host, port in workers[:rank]:
            self._adopt(info.id, *mesh.connect(host, port, secret, rank, deadline))
        with self._lock:
            ok = self._lock.wait_for(lambda: len(self._peers) == world_size - 1, deadline - time.monotonic())
        if not ok:
            missing = sorted(set(range(world_size)) - set(self._peers) - {rank})
            self.close()
            raise RuntimeError(f"init_rpc: workers {missing} did not connect to {self.info} in time")
        threading.Thread(target=self._watch, name=f"rpc-watchdog-{rank}", daemon=True).start()

    # --- connections -------------------------------------------------------------------------------------
    def _adopt(self, peer: int, sock, cma=(0, False)) -> bool:
        with self._lock:
            if peer in self._peers or peer in self._gone or self.closing:
                return False
            conn = self._peers[peer] = Connection(sock, peer, self.limits, *cma)
            conn.reading = ReadingRole()
            self._lock.notify_all()
        threading.Thread(target=self._read, args=(conn,), name=f"rpc-read-{self.rank}<-{peer}", daemon=True).start()
        return True

    def _read(self, conn: Connection) -> None:
        """Read ``conn`` while this thread holds its reading role; serve each request here (threads.py)."""
        reading = conn.reading
        try:
            while True:
                msg = conn.recv()
                if msg.kind != REQUEST:
                    self._on_response(conn.peer, msg)
                    continue
                with self._lock:
                    self.active += 1
                role = reading.serve(lambda: self._hand_over(conn))
                self._serve(conn.peer, msg)
                if not reading.served(role):
                    return  # another thread reads this connection now
        except Exception as e:  # EOF, a reset, a malformed or oversized frame: this connection only
            reason = f"{type(e).__name__}: {e}"
        self._peer_gone(conn, reason)

    def _hand_over(self, conn: Connection, older_than: float = 0.0) -> None:
        if conn.reading.take(older_than=older_than):
            self._callbacks.submit(self._read, conn)

    def _peer_gone(self, conn: Connection, reason: str) -> None:
        with self._lock:
            if self._peers.get(conn.peer) is conn:
                del self._peers[conn.peer]
            self._gone.setdefault(conn.peer, reason)
            failed = [(rid, e) for rid, e in self._pending.items() if e[1] == conn.peer]
        conn.close()
        (log.warning if failed else log.debug if self.closing else log.info)(
            "rpc %s: connection to %s closed (%s)", self.info, self.workers[conn.peer], reason)
        for rid, _ in failed:
            self._fail(rid, RuntimeError(f"RPC to {self.workers[conn.peer]} failed: its connection closed "
                                         f"({reason}); the worker is gone"))

    def _deliver(self, dst: int, msg: Message) -> None:
        if dst == self.rank:
            msg.tensors = [t.detach().clone() for t in msg.tensors]  # a copy, as a remote call would see
            (self._on_request if msg.kind == REQUEST else self._on_response)(dst, msg)
            return
        with self._lock:  # a peer still in init_rpc may not have connected yet: wait for it, not fail
            self._lock.wait_for(lambda: dst in self._peers or dst in self._gone or self.closing,
                                self.options.rpc_timeout or None)
            conn = self._peers.get(dst)
            why = self._gone.get(dst, "agent shut down" if self.closing else "not connected")
        if conn is None:
            raise ConnectionError(f"no connection to {self.workers[dst]} ({why})")
        conn.send(msg)

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
            deadline = time.monotonic() + timeout
            with self._watch_cv:  # wake the watchdog only for a deadline earlier than all it waits for
                heapq.heappush(self._deadlines, (deadline, rid))
                if self._deadlines[0][1] == rid:
                    self._watch_cv.notify()
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

    def _complete(self, fut: RpcFuture, value=None, exc: BaseException | None = None) -> None:
        """Set ``fut``'s result (or error) here if no callback was chained to it, else on a callback thread."""
        with fut._cb_lock:
            if not fut._has_callbacks:
                fut.set_result(value) if exc is None else fut.set_exception(exc)
                return
        self._callbacks.submit(settle, fut, value, exc)

    def _fail(self, rid: int, exc: BaseException) -> None:
        entry = self._claim(rid)
        if entry is not None:
            self._complete(entry[0], exc=exc)
            self._completed()

    def _on_response(self, src: int, msg: Message) -> None:
        entry = self._claim(msg.rid)
        if entry is None:
            return  # timed out already, or a stray id
        fut = entry[0]
        try:
            value = serialize.decode(msg, src, self)
        except Exception as e:
            self._complete(fut, exc=RuntimeError(f"cannot decode the response from {self.workers[src]}: {e!r}"))
        else:
            if msg.flags & FLAG_ERROR:
                self._complete(fut, exc=serialize.rebuild_error(value))
            else:
                self._complete(fut, value)
        finally:
            self._completed()

    def _watch(self) -> None:
        """Fail requests past their deadline. Answered requests stay in the heap until their deadline comes up
        (skipped then); the heap is rebuilt from the pending table when they outnumber it."""
        while not self.closing:
            with self._watch_cv:
                now, expired = time.monotonic(), []
                while self._deadlines and self._deadlines[0][0] <= now:
                    expired.append(heapq.heappop(self._deadlines)[1])
                if not expired:
                    if len(self._deadlines) > 2 * len(self._pending) + 1024:
                        self._deadlines = [e for e in self._deadlines if e[1] in self._pending]
                        heapq.heapify(self._deadlines)
                    self._watch_cv.wait(min(self._deadlines[0][0] - now, TAKEOVER_S) if self._deadlines
                                        else TAKEOVER_S)
                    expired = None
            if expired is None:  # no deadline due: a reader serving one request too long gets a successor
                for conn in list(self._peers.values()):
                    self._hand_over(conn, older_than=TAKEOVER_S)
                continue
            for rid in expired:
                entry = self._pending.get(rid)
                if entry is not None:
                    _, dst, timeout = entry
                    self._fail(rid, RpcTimeoutError(
                        f"RPC ran for more than set timeout ({int(timeout * 1000)} ms) and will now be marked "
                        f"with an error (call to {self.workers[dst]})"))

    # --- incoming ----------------------------------------------------------------------------------------
    def _on_request(self, src: int, msg: Message) -> None:
        with self._lock:
            self.active += 1
        try:
            self._pool.submit(self._serve, src, msg)
        except RuntimeError:  # pool shut down
            self._finish()

    def _serve(self, src: int, msg: Message) -> None:
        from pt_dist.autograd import container as ag

        ctx, waits = None, []
        try:
            ctx = ag.get_or_create(msg.ctx_id, src) if msg.ctx_id >= 0 else None
            with ag.current(ctx):
                op, *body = serialize.decode(msg, src, self, waits)
        except BaseException as e:
            self._respond(src, msg, e, ctx, traceback.format_exc())
            return
        if waits:  # RRef arguments not yet confirmed by their owners: run once they are, holding no thread
            torch.futures.collect_all(waits).add_done_callback(
                lambda _: self._resubmit(src, msg, ctx, op, body))
            return
        self._handle(src, msg, ctx, op, body)

    def _resubmit(self, src: int, msg: Message, ctx, op, body) -> None:
        try:
            self._pool.submit(self._handle, src, msg, ctx, op, body)
        except RuntimeError:  # pool shut down
            self._finish()

    def _handle(self, src: int, msg: Message, ctx, op: str, body) -> None:
        from pt_dist.autograd import container as ag

        try:
            with ag.current(ctx):
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
        """Run ``fn`` on the pool (RRef deletes from ``__del__``: never send from inside the garbage collector)."""
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

    def gone(self) -> dict[int, str]:
        with self._lock:
            return dict(self._gone)

    def close(self) -> None:
        with self._lock:
            self.closing = True
            pending, self._pending = self._pending, {}
            peers = list(self._peers.values())
            self._lock.notify_all()
        self.listener.close()
        for conn in peers:
            conn.close()
        for fut, dst, _ in pending.values():
            fut.set_exception(RuntimeError(f"RPC agent of {self.info} shut down before {self.workers[dst]} answered"))
        self._pool.shutdown()
