"""The socket mesh under the native backends: one authenticated connection per peer and purpose.

Every rank listens on ``host:0`` (127.0.0.1 unless told otherwise; with ``0.0.0.0`` it advertises its
address on the route to the store), publishes the address in the group's store, and the higher rank of
each pair connects to the lower one (as gloo's full-mesh pairs do). A connector must pass the
shared-secret handshake (each in its own thread, so a silent stranger holds no one off) before it may even
name its rank; strangers are dropped and the listener is closed once the mesh is complete. Collectives
use ``sendrecv`` (full-duplex streaming into preallocated ``memoryview`` s, no per-chunk copies);
point-to-point traffic gets its own sockets and threads so an ``isend`` never blocks behind, or
interleaves with, a collective.
"""

from __future__ import annotations

import select
import selectors
import socket
import struct
import threading
import time

import torch

from pt_dist import wire
from pt_dist.backends.p2p import P2PChannels
from pt_dist.errors import DistBackendError, DistError, DistNetworkError, missing_text
from pt_dist.work import Work

COLL, P2P = 0, 1
MAX_HEADER = 1 << 16


def advertised_address(host: str, store) -> str:
    """The address peers should dial: ``host``, or for a wildcard listen address (``0.0.0.0``, as multi-host
    jobs use) the address this host uses to reach the store, as gloo picks the interface toward its peers."""
    if host not in ("0.0.0.0", ""):
        return host
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if hasattr(store, "local_address"):
        return store.local_address()
    return socket.gethostbyname(socket.gethostname())  # a FileStore on a shared filesystem


def _loopback_hint(host: str) -> str:
    """Ranks listen on 127.0.0.1 unless told otherwise, which peers on other hosts cannot reach."""
    if not host.startswith("127.") and host != "localhost":
        return ""
    return ("; ranks listen on loopback only by default: on several hosts set PT_DIST_LISTEN_ADDR=0.0.0.0 "
            "(or this host's address) for every rank")


class PeerMesh:
    def __init__(self, store, rank: int, size: int, secret: bytes, timeout: float, group_name: str,
                 host: str = "127.0.0.1"):
        self.rank, self.size, self.timeout, self.group_name = rank, size, timeout, group_name
        self.socks: dict[tuple[int, int], socket.socket] = {}
        self._closed = False
        # accepted connections (from the higher ranks): counted by the handshake threads under the lock
        self._accept_lock, self._all_in = threading.Lock(), threading.Event()
        self._expected, self._accepted, self._accepting = 2 * (size - 1 - rank), 0, True
        if not self._expected:
            self._all_in.set()
        self.channels = P2PChannels({}, group_name, timeout, self._fail)
        if size == 1:
            return
        listener = wire.listen(host, 0, backlog=4 * size)
        try:
            store.set(f"mesh/{rank}", f"{size} {advertised_address(host, store)}:{listener.getsockname()[1]}")
            threading.Thread(target=self._accept, args=(listener, secret), daemon=True,
                             name=f"pt_dist-mesh-accept-{group_name}").start()
            for peer in range(rank):
                their_size, where = store.get(f"mesh/{peer}").decode().split(" ", 1)
                if int(their_size) != size:  # say so now; rank 0 would otherwise wait out the timeout for us
                    store.set("mesh/refused", f"rank {rank} was started with a group of {size}, rank {peer} with "
                                              f"{their_size} (different world sizes?)")
                    raise DistError(f"group {group_name!r}: {store.get('mesh/refused').decode()}")
                peer_host, port = where.rsplit(":", 1)
                for chan in (COLL, P2P):
                    self.socks[(peer, chan)] = self._connect(peer, peer_host, int(port), secret, chan)
            deadline = time.monotonic() + self.timeout
            while not self._all_in.wait(0.1) and time.monotonic() < deadline:
                if store.check(["mesh/refused"]):
                    raise DistError(f"group {group_name!r}: a peer refused the group: "
                                    f"{store.get('mesh/refused').decode()}")
            with self._accept_lock:
                self._accepting = False  # a handshake finishing from now on closes its connection
            missing = sorted({p for p in range(rank + 1, size) for c in (COLL, P2P) if (p, c) not in self.socks})
            if missing:
                raise DistNetworkError(f"group {group_name!r}: mesh setup timed out after {timeout:.1f}s; "
                                       f"{missing_text(missing)}{_loopback_hint(host)}")
        except BaseException:  # a timeout, or Ctrl-C while waiting for a peer: release what is connected already
            with self._accept_lock:
                self._closed = True  # a handshake finishing later closes its own connection
                for sock in self.socks.values():
                    sock.close()
            raise
        finally:
            try:  # wakes the acceptor if setup failed half-way (a close alone leaves it blocked until the timeout)
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for (peer, chan), sock in self.socks.items():
            wire.tune(sock)
            sock.setblocking(chan != COLL)
            if chan == P2P:
                sock.settimeout(timeout)
                self.channels.add_peer(peer, sock)

    def _accept(self, listener: socket.socket, secret: bytes) -> None:
        """Take connections until the setup closes the listener (all peers in, or it gave up). Each handshake
        runs in its own thread (a bounded number at once), so a silent stranger delays no one: a serial
        acceptor waited out its handshake timeout before greeting the next connection."""
        gate, deadline = wire.HandshakeGate(2 * self.size + 16), time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:  # the setup closes the listener when it is done or gives up: then this thread ends
                listener.settimeout(max(0.01, deadline - time.monotonic()))
                conn, _ = listener.accept()
            except OSError:
                return
            if not gate.enter(conn):
                conn.close()  # a crowd of strangers: refused; a real peer retries
                continue
            try:
                threading.Thread(target=self._greet, args=(conn, secret, gate), daemon=True,
                                 name=f"pt_dist-mesh-greet-{self.group_name}").start()
            except RuntimeError:  # no thread to spare: refuse this one (a real peer retries)
                gate.leave(conn)
                conn.close()

    def _greet(self, conn: socket.socket, secret: bytes, gate: wire.HandshakeGate) -> None:
        try:
            conn.settimeout(wire.HANDSHAKE_TIMEOUT)
            wire.server_handshake(conn, secret, gate)
            peer, chan = struct.unpack("<ii", wire.recv_exact(conn, 8))
            with self._accept_lock:
                if not (self.rank < peer < self.size and chan in (COLL, P2P)) or (peer, chan) in self.socks:
                    raise wire.ProtocolError(f"bad mesh identity rank={peer} channel={chan}")
                if not self._accepting or self._closed:  # too late: the setup is over, or gave up
                    raise wire.ProtocolError("mesh setup is over")
                self.socks[(peer, chan)] = conn
                self._accepted += 1
                if self._accepted == self._expected:
                    self._all_in.set()
        except (OSError, wire.ProtocolError, struct.error):
            conn.close()  # a stranger or a garbled peer: drop it, keep waiting for the real ones

    def _connect(self, peer: int, host: str, port: int, secret: bytes, chan: int) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=wire.HANDSHAKE_TIMEOUT)
                wire.client_handshake(sock, secret)
                sock.sendall(struct.pack("<ii", self.rank, chan))
                return sock
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DistNetworkError(f"group {self.group_name!r}: cannot reach rank {peer} at {host}:{port}: {e}"
                                           f"{_loopback_hint(host)}") from e
                time.sleep(0.02)

    def set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        self.channels.set_timeout(seconds)

    def close(self) -> None:
        self._closed = True
        self.channels.stop()
        for sock in self.socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.channels.join()

    # collectives ---------------------------------------------------------------------------------
    def _fail(self, op: str, why: str, peers) -> DistBackendError:
        # the sockets' own errors (EBADF, reset, our own shutdown read as the peer's close) hide the cause
        if self._closed and not why.startswith("the group was aborted"):
            why = f"the group was aborted or shut down mid-collective ({why})"
        return DistBackendError(f"{op} on group {self.group_name!r} (rank {self.rank} of {self.size}): {why}; "
                                f"{missing_text(peers)}")

    def sendrecv(self, op: str, dst: int | None, send: memoryview | None, src: int | None,
                 recv: memoryview | None, chunk: int = 0, on_chunk=None) -> None:
        """Stream ``send`` to ``dst`` while filling ``recv`` from ``src``; either may be None.

        With ``on_chunk``, ``on_chunk(lo, hi)`` is called for each completed ``chunk``-byte range of
        ``recv`` as soon as it has arrived, so a reduction overlaps the rest of the transfer.
        """
        folded = 0
        ns = len(send) if send is not None else 0
        nr = len(recv) if recv is not None else 0
        ss = self.socks[(dst, COLL)] if ns else None
        rs = self.socks[(src, COLL)] if nr else None
        sent = got = 0
        deadline = time.monotonic() + self.timeout
        while sent < ns or got < nr:
            progressed = False
            if sent < ns:
                try:
                    sent += ss.send(send[sent:])
                    progressed = True
                except BlockingIOError:
                    pass
                except OSError as e:
                    raise self._fail(op, f"sending to rank {dst} failed ({e!r})", [dst]) from None
            if got < nr:
                try:
                    k = rs.recv_into(recv[got:])
                except BlockingIOError:
                    k = -1
                except OSError as e:
                    raise self._fail(op, f"receiving from rank {src} failed ({e!r})", [src]) from None
                if k == 0:
                    raise self._fail(op, f"rank {src} closed its connection (exited or aborted)", [src])
                if k > 0:
                    got += k
                    progressed = True
                    while on_chunk is not None and folded < got and (got - folded >= chunk or got == nr):
                        hi = min(folded + chunk, got) if got < nr else min(folded + chunk, nr)
                        on_chunk(folded, hi)
                        folded = hi
            if progressed:
                continue
            if self._closed:  # aborted from another thread: the sockets may be gone from under the poll
                raise self._fail(op, "the group was aborted or shut down mid-collective",
                                 [p for p in (src, dst) if p is not None])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = ([src] if got < nr else []) + ([dst] if sent < ns else [])
                raise self._fail(op, f"timed out after {self.timeout:.1f}s (sent {sent}/{ns} bytes to rank {dst}, "
                                 f"got {got}/{nr} from rank {src})", waiting)
            # wait only for what is still pending: a socket that is merely writable must not wake us
            poller = select.poll()
            events: dict[int, int] = {}
            if sent < ns:
                events[ss.fileno()] = select.POLLOUT
            if got < nr:
                events[rs.fileno()] = events.get(rs.fileno(), 0) | select.POLLIN
            for fd, ev in events.items():
                poller.register(fd, ev)
            poller.poll(int(min(remaining, 1.0) * 1000) + 1)

    def exchange_headers(self, op: str, header: bytes) -> list[bytes]:
        """All-to-all of small frames in one round: send ours to everyone, read everyone's at once."""
        if len(header) > MAX_HEADER:
            raise ValueError(f"{op}: collective header of {len(header)} bytes is too large")
        out = [b""] * self.size
        out[self.rank] = header
        frame = struct.pack("<I", len(header)) + header
        for peer in range(self.size):
            if peer != self.rank:
                self.sendrecv(op, peer, memoryview(frame), None, None)
        pending = {p: bytearray() for p in range(self.size) if p != self.rank}
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            for p in pending:
                sel.register(self.socks[(p, COLL)], selectors.EVENT_READ, p)
            while pending:
                if self._closed:
                    raise self._fail(op, "the group was aborted or shut down while waiting for peers", pending)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._fail(op, f"timed out after {self.timeout:.1f}s waiting for peers to join the "
                                     f"collective", pending)
                for key, _ in sel.select(min(remaining, 1.0)):
                    p = key.data
                    if p not in pending:
                        continue
                    buf = pending[p]
                    need = 4 if len(buf) < 4 else 4 + struct.unpack_from("<I", buf)[0]
                    try:
                        chunk = key.fileobj.recv(need - len(buf))
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        raise self._fail(op, f"rank {p} connection failed ({e!r})", [p]) from None
                    if not chunk:
                        raise self._fail(op, f"rank {p} closed its connection (exited or aborted)", [p])
                    buf += chunk
                    if len(buf) >= 4 and struct.unpack_from("<I", buf)[0] > MAX_HEADER:
                        raise self._fail(op, f"rank {p} sent a malformed collective header", [p])
                    if len(buf) >= 4 and len(buf) == 4 + struct.unpack_from("<I", buf)[0]:
                        out[p] = bytes(buf[4:])
                        del pending[p]
                        sel.unregister(key.fileobj)
        return out

    # point to point ------------------------------------------------------------------------------
    def p2p(self, kind: str, t: torch.Tensor, peer: int, tag: int, copy_back=None) -> Work:
        """Sends to one peer stay ordered; receives match by tag (``p2p.py``)."""
        if self._closed:
            raise DistBackendError(f"{kind} on group {self.group_name!r}: the group was shut down or failed")
        if kind == "send":
            return self.channels.send(t, peer, tag)
        return self.channels.recv(t, peer, tag, copy_back)
