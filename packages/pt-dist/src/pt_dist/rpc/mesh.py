"""The agent's connections: a listener open for the job and one proven socket per pair of workers.

What ``TensorPipeAgent``'s listener and ``connectToWorker`` do (torch/csrc/distributed/rpc/tensorpipe_agent.cpp),
over pt_dist's ``wire.py``: each worker binds ``options.host`` (127.0.0.1 unless configured), publishes
``name, host, port`` in the store, and connects to every lower rank; the higher ranks connect to it. Each
connection runs the mutual shared-secret handshake before a single frame is decoded, then the connector names
its rank in a small hello frame; a connection that fails either, or names a rank that is taken or not higher,
is closed and the listener goes on serving. The secret is a fresh random one rank 0 puts in the (already
authenticated) store, as ``secret.mesh_secret`` does for the collectives' sockets.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time

from pt_dist._infra import wire
from pt_dist.rpc import cma_channel
from pt_dist.rpc.options import WorkerInfo

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


def gather(store, world_size: int) -> list[tuple[WorkerInfo, str, int]]:
    """Every worker's identity and address; names must be unique (torch's ``WorkerInfo`` contract)."""
    out = []
    for r in range(world_size):
        name, host, port = bytes(store.get(f"rpc/worker/{r}")).decode().split("\n")
        out.append((WorkerInfo(name, r), host, int(port)))
    names = [w.name for w, _, _ in out]
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
            cma = cma_channel.exchange(conn, first=False)
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
    the cross-memory probe found (cma_channel.py)."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            wire.client_handshake(sock, secret)
            wire.send_frame(sock, struct.pack("<I", rank))
            return sock, cma_channel.exchange(sock, first=True)
        except wire.ProtocolError:
            raise
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
