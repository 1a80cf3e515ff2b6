"""Meeting the group's peers: one proven connection per peer and purpose, before any collective runs.

The setup half of the socket mesh (gloo's ``connectFullMesh``; c10d hands gloo a store to find peers through, as
here). Every rank listens on ``host:0`` (127.0.0.1 unless told otherwise; with ``0.0.0.0`` it advertises its
address on the route to the store), publishes the address in the group's store, and the higher rank of each pair
connects to the lower one. A connector must pass the shared-secret handshake (``wire.py``) before it may even name
its rank. The hardening lives here: each connection is greeted in its own thread (bounded by
``wire.HandshakeGate``), so a silent stranger holds no one off; strangers are dropped; ranks started with
different world sizes fail at once; a setup that gives up (a timeout, Ctrl-C) releases what it connected; and the
listener closes once the mesh is complete, so a connection after that is refused.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from pt_dist._infra import wire
from pt_dist._infra.errors import DistError, DistNetworkError, missing_text

COLL, P2P = 0, 1  # each pair of ranks gets two sockets: collectives, and point-to-point traffic


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


class MeshSetup:
    """Builds ``socks``: (peer, COLL or P2P) -> a connected socket whose peer proved the secret."""

    def __init__(self, rank: int, size: int, timeout: float, group_name: str):
        self.rank, self.size, self.timeout, self.group_name = rank, size, timeout, group_name
        self.socks: dict[tuple[int, int], socket.socket] = {}
        self._closed = False
        # accepted connections (from the higher ranks): counted by the handshake threads under the lock
        self._accept_lock, self._all_in = threading.Lock(), threading.Event()
        self._expected, self._accepted, self._accepting = 2 * (size - 1 - rank), 0, True
        if not self._expected:
            self._all_in.set()

    def connect(self, store, secret: bytes, host: str) -> dict[tuple[int, int], socket.socket]:
        """Collective over the group: listen, publish, dial the lower ranks, wait for the higher ones."""
        rank, size, timeout, group_name = self.rank, self.size, self.timeout, self.group_name
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
        return self.socks

    def _accept(self, listener: socket.socket, secret: bytes) -> None:
        """Take connections until the setup closes the listener (all peers in, or it gave up). Each handshake
        runs in its own thread (a bounded number at once), so a silent stranger delays no one."""
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

