"""Point-to-point channels: ordered sends and tag-matched receives, as gloo's (and MPI's) send/recv.

Each peer pair has one socket for point-to-point traffic, apart from the collectives'. Sends to a peer go
out in order from one thread per peer, each message a header (tag, bytes, dtype) and the tensor's bytes.
Receives match by tag, not by arrival: while any receive is posted, a reader thread per peer reads each
header and streams the payload straight into the earliest receive posted for that tag (from that peer,
or from any peer: ``src=None``), or, when there is none, keeps it as an *unexpected message* (MPI's term)
until one is posted. So ``irecv(tag=2)`` posted before ``irecv(tag=1)`` completes both, whatever order
they were sent in; messages of one tag arrive in the order sent. A receive nothing arrives for fails at
the group timeout and leaves the channel usable; a peer that dies, or a message cut off half-way, fails
every pending receive from it and every later one.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import select
import socket
import struct
import threading
import time

import torch

from pt_dist._infra import wire
from pt_dist._infra.errors import DistBackendError
from pt_dist._infra.wire import byte_view

_HEAD = struct.Struct("<qq16s")
_POLL_S = 0.2  # how often an idle reader checks its posted receives' deadlines


class _Recv:
    __slots__ = ("work", "t", "copy_back", "tag", "deadline", "seq", "peer")
    _count = itertools.count()

    def __init__(self, work, t: torch.Tensor, copy_back, tag: int, deadline: float):
        self.work, self.t, self.copy_back, self.tag, self.deadline = work, t, copy_back, tag, deadline
        self.seq = next(self._count)  # posting order: a message goes to the earliest receive that matches it


class P2PChannels:
    """The point-to-point half of a ``PeerMesh``: ``socks`` maps a peer to its p2p socket (blocking, with the
    group timeout); ``fail(op, why, peers)`` builds the group's DistError; ``make_work(op)`` the handle a send or
    receive returns (``work.ChannelWork``: finished here with ``_finish``), and ``on_transport_thread()`` is called
    once by each thread of a channel (``work.callbacks_elsewhere``: their futures' callbacks then run elsewhere)."""

    def __init__(self, socks: dict[int, socket.socket], group_name: str, timeout: float, fail, make_work,
                 on_transport_thread):
        self._socks, self._group, self._timeout, self._fail = socks, group_name, timeout, fail
        self._make_work, self._on_transport_thread = make_work, on_transport_thread
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # a reader waits on it while nothing is posted
        self._sends: dict[int, queue.Queue] = {}
        # peer (None: any) -> tag -> receives in posting order; peer -> tag -> messages nobody had asked for yet
        self._posted: dict[int | None, dict[int, collections.deque]] = collections.defaultdict(dict)
        self._unexpected: dict[int, dict[int, collections.deque]] = collections.defaultdict(dict)
        self._broken: dict[int, str] = {}  # peer -> why its stream is out of step
        self._readers: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def add_peer(self, peer: int, sock: socket.socket) -> None:
        self._socks[peer] = sock

    def _start(self, target, peer: int, name: str) -> None:
        th = threading.Thread(target=target, args=(peer,), daemon=True, name=f"pt_dist-{name}-{peer}")
        self._threads.append(th)
        th.start()

    def _unusable(self, kind: str, peer: int) -> DistBackendError:
        if self._closed:
            return DistBackendError(f"{kind} on group {self._group!r}: the group was shut down or failed")
        return DistBackendError(f"{kind} on group {self._group!r}: the channel with rank {peer} is unusable after an "
                                f"earlier failure ({self._broken[peer]})")

    # sends ---------------------------------------------------------------------------------------
    def send(self, t: torch.Tensor, peer: int, tag: int):
        work = self._make_work("send")
        with self._lock:
            if self._closed:
                raise self._unusable("send", peer)
            if peer not in self._sends:
                self._sends[peer] = queue.Queue()
                self._start(self._send_loop, peer, "send")
            self._sends[peer].put((work, t, tag))
        return work

    def _send_loop(self, peer: int) -> None:
        self._on_transport_thread()
        sock = self._socks[peer]
        while True:
            item = self._sends[peer].get()
            if item is None:
                return
            work, t, tag = item
            try:
                if peer in self._broken:
                    raise self._unusable("send", peer)
                view = byte_view(t)
                sock.sendall(_HEAD.pack(tag, len(view), str(t.dtype).encode()[:16]))
                sock.sendall(view)
                work._finish([t])
            except DistBackendError as e:
                work._finish(exc=e)
            except (OSError, ConnectionError) as e:  # cut mid-message, maybe: what follows would be misread
                self._broken.setdefault(peer, repr(e))
                work._finish(exc=self._fail("send", f"peer rank {peer} failed or timed out ({e!r})", [peer]))
            except Exception as e:  # noqa: BLE001 - anything else goes to the caller; the thread must live on
                work._finish(exc=e)
            item = work = t = view = None  # hold no caller's tensor while idle

    # receives ------------------------------------------------------------------------------------
    def recv(self, t: torch.Tensor, peer: int | None, tag: int, copy_back=None):
        """``peer=None``: from whichever peer sends ``tag`` first (gloo's recvAnysource); the Work's
        ``_source_rank()`` then says who."""
        rec = _Recv(self._make_work("recv"), t, copy_back, tag, time.monotonic() + self._timeout)
        rec.peer = peer
        with self._lock:
            if self._closed or peer in self._broken:
                raise self._unusable("recv", peer)
            sources = list(self._socks) if peer is None else [peer]
            if peer is None and sources and all(p in self._broken for p in sources):  # no reader left for it
                raise self._fail("recv", "any-source receive, but the channel with every peer is unusable after "
                                 f"an earlier failure ({self._broken[sources[0]]})", sources)
            source = next((p for p in sources if self._unexpected[p].get(tag)), None)
            msg = self._unexpected[source][tag].popleft() if source is not None else None
            if msg is None:
                self._posted[peer].setdefault(tag, collections.deque()).append(rec)
                self._cv.notify_all()
                for p in sources:
                    if p not in self._readers:
                        self._readers.add(p)
                        self._start(self._read_loop, p, "recv")
        if msg is not None:
            self._fill(rec, source, *msg)
        return rec.work

    def _matches(self, rec: _Recv, peer: int, nbytes: int, dtype: bytes) -> bool:
        want = (rec.t.numel() * rec.t.element_size(), str(rec.t.dtype).encode()[:16])
        if (nbytes, dtype) == want:
            return True
        rec.work._finish(exc=DistBackendError(
            f"recv on group {self._group!r}: rank {peer} sent tag={rec.tag} {dtype.decode()} x {nbytes} bytes, "
            f"this receive expects {rec.t.dtype} x {want[0]} bytes"))
        return False

    def _fill(self, rec: _Recv, source: int, nbytes: int, dtype: bytes, payload: bytes) -> None:
        """Complete ``rec`` from a message already read (an unexpected one)."""
        if self._matches(rec, source, nbytes, dtype):
            try:
                byte_view(rec.t)[:] = payload
            except Exception as e:  # noqa: BLE001 - the caller's error, the channel is in step
                rec.work._finish(exc=e)
                return
            self._complete(rec, source)

    @staticmethod
    def _complete(rec: _Recv, source: int) -> None:
        rec.work._source = source
        try:
            if rec.copy_back is not None:
                with torch.inference_mode():  # the caller's tensor may be an inference tensor
                    rec.copy_back.copy_(rec.t)
        except Exception as e:  # noqa: BLE001 - delivered to the caller; the reader goes on
            rec.work._finish(exc=e)
            return
        rec.work._finish([rec.copy_back if rec.copy_back is not None else rec.t])

    def _read_loop(self, peer: int) -> None:
        """Read only while some receive from ``peer`` is posted: a message nobody has asked for yet stays in the
        socket, so the usual order (send, then a matching receive) streams straight into the tensor."""
        self._on_transport_thread()
        sock = self._socks[peer]
        try:
            while not self._closed:
                with self._cv:
                    if not any(self._posted[peer].values()) and not any(self._posted[None].values()):
                        self._cv.wait(_POLL_S)
                        continue
                if select.select([sock], [], [], _POLL_S)[0]:
                    self._read_one(peer, sock)
                self._expire(peer)  # also while other tags' messages keep arriving
        except (OSError, ConnectionError, ValueError) as e:  # ValueError: select on a socket closed under us
            with self._lock:
                if not self._closed:
                    self._broken.setdefault(peer, repr(e))
                pending = [r for q in self._posted[peer].values() for r in q]
                self._posted[peer].clear()
                if len(self._broken) == len(self._socks):  # no reader left to serve a receive from any rank
                    pending += [r for q in self._posted[None].values() for r in q]
                    self._posted[None].clear()
            for r in pending:
                r.work._finish(exc=self._unusable("recv", peer) if self._closed else
                               self._fail("recv", f"peer rank {peer} failed or its stream broke ({e!r})", [peer]))

    def _take(self, peer: int, tag: int) -> _Recv | None:
        """The earliest posted receive this message matches: one for ``peer``, or one from any source (hold the
        lock)."""
        queues = [q for q in (self._posted[peer].get(tag), self._posted[None].get(tag)) if q]
        return min(queues, key=lambda q: q[0].seq).popleft() if queues else None

    def _read_one(self, peer: int, sock: socket.socket) -> None:
        """One message: into the receive posted for it, else aside. Transport errors propagate (the stream is out
        of step); anything else fails that receive only, after the payload is consumed."""
        tag, nbytes, dtype = _HEAD.unpack(wire.recv_exact(sock, _HEAD.size))
        dtype = dtype.rstrip(b"\0")
        with self._lock:
            rec = self._take(peer, tag)
        if rec is None:
            payload = wire.recv_exact(sock, nbytes)  # another tag's receive is posted: keep this one aside
            with self._lock:  # unless its own receive was posted while the payload streamed in
                rec = self._take(peer, tag)
                if rec is None:
                    self._unexpected[peer].setdefault(tag, collections.deque()).append((nbytes, dtype, payload))
                    return
            self._fill(rec, peer, nbytes, dtype, payload)
            return
        view = None
        if self._matches(rec, peer, nbytes, dtype):
            try:
                view = byte_view(rec.t)
            except Exception as e:  # noqa: BLE001 - the caller's error: fail it below, once the bytes are drained
                rec.work._finish(exc=e)
        if view is None:
            wire.recv_exact(sock, nbytes)  # drained: the stream stays in step
            return
        try:
            wire.recv_into_exact(sock, view)
        except BaseException as e:  # cut off half-way: this receive fails too, not only those still posted
            rec.work._finish(exc=self._fail("recv", f"peer rank {peer} failed mid-message ({e!r})", [peer]))
            raise
        self._complete(rec, peer)

    def _expire(self, peer: int) -> None:
        """Fail receives that waited out the timeout; nothing was read for them, so the channel stays in step."""
        now, expired = time.monotonic(), []
        with self._lock:
            for waiting in [*self._posted[peer].values(), *self._posted[None].values()]:
                while waiting and waiting[0].deadline <= now:
                    expired.append(waiting.popleft())
        for r in expired:
            who = f"rank {r.peer}" if r.peer is not None else "any rank"
            r.work._finish(exc=self._fail("recv", f"nothing arrived from {who} with tag={r.tag} within "
                                                  f"{self._timeout:.1f}s", [r.peer] if r.peer is not None else
                                          sorted(self._socks)))

    def set_timeout(self, seconds: float) -> None:
        """For receives posted from now on, and for the sockets' blocking sends and reads."""
        self._timeout = seconds
        for sock in self._socks.values():
            with contextlib.suppress(OSError):  # closed already: the group failed or was shut down
                sock.settimeout(seconds)

    def stop(self) -> None:
        """First step of the mesh's close, before it shuts the sockets: from now on failures read as a shutdown, and
        receives still waiting fail now (no reader will serve them)."""
        with self._cv:
            self._closed = True
            sends = list(self._sends.values())
            pending = [r for tags in self._posted.values() for q in tags.values() for r in q]
            self._posted.clear()
            self._cv.notify_all()
        for q in sends:
            q.put(None)
        for r in pending:
            r.work._finish(exc=self._unusable("recv", r.peer))

    def join(self) -> None:
        """Last step: wait for the threads to drop their last tensors (a daemon thread still freeing one while the
        interpreter exits is killed inside torch's C++ destructor, which aborts the process)."""
        for th in self._threads:
            if th is not threading.current_thread():
                th.join(5.0)
