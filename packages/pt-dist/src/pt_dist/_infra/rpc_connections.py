"""The RPC agent's connections: a listener open for the job, one proven socket per pair of workers, a reader each.

What ``TensorPipeAgent``'s listener, ``connectToWorker`` and pipe reads do (torch/csrc/distributed/rpc/
tensorpipe_agent.cpp), over pt_dist's ``wire.py``: each worker binds ``host`` (127.0.0.1 unless configured),
publishes ``name, host, port`` in the store, and connects to every lower rank; the higher ranks connect to it.
Each connection runs the mutual shared-secret handshake before a single frame is decoded, then the connector
names its rank in a small hello frame; a connection that fails either, or names a rank that is taken or not
higher, is closed and the listener goes on serving. The secret is a fresh random one rank 0 puts in the
(already authenticated) store, as ``secret.mesh_secret`` does for the collectives' sockets.

Each connection has one reader. It hands a response to ``on_response`` and serves a request itself through
``on_request`` (no hand-off to a pool: one thread wake-up less per call). While it serves, nobody reads that
connection, so the reading moves to another thread (``rpc_threads.ReadingRole``) the moment the handler waits
on an ``RpcFuture`` (a nested call whose answer may come on this very connection) and, for any other wait,
once the handler has run for ``TAKEOVER_S``. A connection that breaks (EOF, a reset, a malformed or oversized
frame) is closed alone and reported to ``on_gone``.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time

from pt_dist._infra import rpc_cma, wire
from pt_dist._infra.rpc_threads import TAKEOVER_S, CallbackThreads, ReadingRole
from pt_dist._infra.rpc_transport import REQUEST, Connection, Limits, Message

log = logging.getLogger(__name__)

HELLO_MAX = 4096


def job_secret(store, rank: int) -> bytes:
    if rank == 0:
        token = secrets.token_hex(16)
        store.set("rpc/secret", token)
        return token.encode()
    return bytes(store.get("rpc/secret"))


def publish(store, rank: int, name: str, host: str, port: int) -> None:
    advertised = socket.getfqdn() if host in ("", "0.0.0.0", "::") else host
    store.set(f"rpc/worker/{rank}", f"{name}\n{advertised}\n{port}")


def gather(store, world_size: int) -> list[tuple[str, str, int]]:
    """Every worker's ``(name, host, port)`` by rank; names must be unique (torch's ``WorkerInfo`` contract)."""
    out = []
    for r in range(world_size):
        name, host, port = bytes(store.get(f"rpc/worker/{r}")).decode().split("\n")
        out.append((name, host, int(port)))
    names = [name for name, _, _ in out]
    if len(set(names)) != len(names):
        raise RuntimeError(f"RPC worker names must be unique, got {names}")
    return out


class Listener:
    """Accepts peers for the job's lifetime; hands each proven connection to ``on_peer(rank, sock, cma)``."""

    def __init__(self, host: str, secret: bytes, rank: int, world_size: int, on_peer):
        self.sock = wire.listen(host, 0, backlog=max(16, world_size))
        self.port = self.sock.getsockname()[1]
        self.secret, self.rank, self.world_size, self.on_peer = secret, rank, world_size, on_peer
        self.gate = wire.HandshakeGate(16)
        self.refused = 0  # connections closed at the handshake or hello (observable in tests)
        self._closing = False
        threading.Thread(target=self._accept, name=f"rpc-accept-{rank}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self.gate.enter(conn):
                conn.close()
                continue
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        try:
            wire.server_handshake(conn, self.secret, self.gate)
            conn.settimeout(wire.HANDSHAKE_TIMEOUT)
            hello = wire.recv_frame(conn, HELLO_MAX)
            if len(hello) < 4:
                raise wire.ProtocolError("short hello")
            (peer,) = struct.unpack_from("<I", hello)
            if not self.rank < peer < self.world_size:
                raise wire.ProtocolError(f"hello names rank {peer}, not a higher rank of {self.world_size}")
            cma = rpc_cma.exchange(conn, first=False)
            if not self.on_peer(peer, conn, cma):
                raise wire.ProtocolError(f"rank {peer} is already connected")
        except (OSError, wire.ProtocolError, struct.error) as e:
            self.refused += 1
            log.warning("rpc worker %d: closed an incoming connection: %s", self.rank, e)
            conn.close()

    def close(self) -> None:
        self._closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
        except OSError:
            pass
        self.sock.close()


def connect(host: str, port: int, secret: bytes, rank: int, deadline: float) -> tuple[socket.socket, tuple]:
    """A proven connection to a lower rank's listener (retried until ``deadline`` while it is not up), and what
    the cross-memory probe found (rpc_cma.py)."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            wire.client_handshake(sock, secret)
            wire.send_frame(sock, struct.pack("<I", rank))
            return sock, rpc_cma.exchange(sock, first=True)
        except wire.ProtocolError:
            raise
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Connections:
    """One worker's connections to every other: ``listen``, ``connect`` them all, ``send`` to one, ``close``.

    ``on_request(peer, msg)`` and ``on_response(peer, msg)`` run on the connection's reader; ``on_gone(peer,
    reason)`` once a connection has broken and been closed."""

    def __init__(self, rank: int, world_size: int, limits: Limits, on_request, on_response, on_gone):
        self.rank, self.world_size, self.limits = rank, world_size, limits
        self._on_request, self._on_response, self._on_gone = on_request, on_response, on_gone
        self._lock = threading.Condition()
        self.peers: dict[int, Connection] = {}
        self.gone: dict[int, str] = {}  # rank -> why its connection closed
        self.closing = False
        self.listener: Listener | None = None
        self._readers = CallbackThreads(f"rpc-read-{rank}")  # where a reader's successor runs

    def listen(self, store, name: str, host: str) -> list[tuple[str, str, int]]:
        """Open the listener, publish our address; every worker's ``(name, host, port)`` by rank."""
        self._secret = job_secret(store, self.rank)
        self.listener = Listener(host, self._secret, self.rank, self.world_size, self._adopt)
        publish(store, self.rank, name, host, self.listener.port)
        return gather(store, self.world_size)

    def connect(self, workers: list[tuple[str, str, int]], deadline: float) -> None:
        """Connect to the lower ranks and wait for the higher ones to connect to us."""
        for peer, (_, peer_host, port) in enumerate(workers[:self.rank]):
            self._adopt(peer, *connect(peer_host, port, self._secret, self.rank, deadline))
        with self._lock:
            ok = self._lock.wait_for(lambda: len(self.peers) == self.world_size - 1, deadline - time.monotonic())
        if not ok:
            missing = sorted(set(range(self.world_size)) - set(self.peers) - {self.rank})
            self.close()
            raise RuntimeError(f"init_rpc: workers {missing} did not connect to worker {self.rank} in time")
        threading.Thread(target=self._watch, name=f"rpc-takeover-{self.rank}", daemon=True).start()

    def _adopt(self, peer: int, sock, cma=(0, False)) -> bool:
        with self._lock:
            if peer in self.peers or peer in self.gone or self.closing:
                return False
            conn = self.peers[peer] = Connection(sock, peer, self.limits, *cma)
            conn.reading = ReadingRole()
            self._lock.notify_all()
        threading.Thread(target=self._read, args=(conn,), name=f"rpc-read-{self.rank}<-{peer}", daemon=True).start()
        return True

    def _read(self, conn: Connection) -> None:
        """Read ``conn`` while this thread holds its reading role; serve each request here."""
        reading = conn.reading
        try:
            while True:
                msg = conn.recv()
                if msg.kind != REQUEST:
                    self._on_response(conn.peer, msg)
                    continue
                role = reading.serve(lambda: self._hand_over(conn))
                self._on_request(conn.peer, msg)
                if not reading.served(role):
                    return  # another thread reads this connection now
        except Exception as e:  # EOF, a reset, a malformed or oversized frame: this connection only
            reason = f"{type(e).__name__}: {e}"
        with self._lock:
            if self.peers.get(conn.peer) is conn:
                del self.peers[conn.peer]
            self.gone.setdefault(conn.peer, reason)
            self._lock.notify_all()
        conn.close()
        self._on_gone(conn.peer, reason)

    def _hand_over(self, conn: Connection, older_than: float = 0.0) -> None:
        if conn.reading.take(older_than=older_than):
            self._readers.submit(self._read, conn)

    def _watch(self) -> None:
        """A reader serving one request for longer than ``TAKEOVER_S`` gets a successor."""
        while not self.closing:
            time.sleep(TAKEOVER_S)
            for conn in list(self.peers.values()):
                self._hand_over(conn, older_than=TAKEOVER_S)

    def send(self, dst: int, msg: Message, timeout: float | None) -> None:
        """Send ``msg`` to worker ``dst``, waiting up to ``timeout`` for a peer still in ``init_rpc`` to connect."""
        with self._lock:
            self._lock.wait_for(lambda: dst in self.peers or dst in self.gone or self.closing, timeout)
            conn = self.peers.get(dst)
            why = self.gone.get(dst, "agent shut down" if self.closing else "not connected")
        if conn is None:
            raise ConnectionError(f"no connection ({why})")
        conn.send(msg)

    def close(self) -> None:
        with self._lock:
            self.closing = True
            peers = list(self.peers.values())
            self._lock.notify_all()
        if self.listener is not None:
            self.listener.close()
        for conn in peers:
            conn.close()
