"""The TCPStore's server side (c10d's ``TCPStoreBackend``), and the store semantics it shares with FileStore's log.

The master's ``StoreServer`` accepts connections, runs the shared-secret handshake (``wire.py``) before
reading anything, then serves one thread per client: requests are ``[command][length-prefixed fields]``
frames, replies a status byte (0: the result follows; 1: the request was refused, the reason follows)
and the result. ``get`` and ``wait`` block on a condition variable until their keys exist, so a rank
waiting for a key costs the server a sleeping thread, not a poll. A malformed frame closes only its
connection; a refused request (``add`` on a key that holds no integer) not even that.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import struct
import threading

from pt_dist._infra import wire
from pt_dist._infra.errors import DistNetworkError

log = logging.getLogger("pt_dist._infra.store")

MAX_FRAME = 64 << 20
# "No timeout" in practice (users pass timedelta.max and the like): socket and lock waits overflow near 292 years
MAX_TIMEOUT_S = 10 * 365 * 86400.0
# Connections in their handshake (not yet proven to hold the secret) at once; past it the oldest is cut
# (``wire.HandshakeGate``), so a flood of silent connections (a port scanner, a stuck client) can neither pile
# up a thread each until the process runs out nor keep the job's own clients (a few per rank) out.
MAX_UNAUTHENTICATED = 64
SET, GET, ADD, CAS, WAIT, DELETE, NUM_KEYS, CHECK, APPEND, MULTI_SET = range(1, 11)


def check_pairs(keys, values) -> None:
    if len(keys) != len(values):
        raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")


class StoreValueError(ValueError):
    """A well-formed request the store refuses (``add`` on a key that holds no integer): the connection goes on."""


def _apply(data: dict, cmd: int, fields: list[bytes]) -> bytes:
    """The store semantics shared by the TCP server and the file log (all non-blocking commands)."""
    if cmd == SET:
        data[fields[0]] = fields[1]
        return b""
    if cmd == ADD:
        old = data.get(fields[0], b"0")
        try:
            value = int(old) + struct.unpack("<q", fields[1])[0]
        except ValueError:
            raise StoreValueError(f"add({fields[0].decode(errors='replace')!r}): the key holds {old[:40]!r}, not "
                                  f"an integer") from None
        value = (value + (1 << 63)) % (1 << 64) - (1 << 63)  # int64 arithmetic, wrapping as c10d's stores do
        data[fields[0]] = str(value).encode()
        return struct.pack("<q", value)
    if cmd == CAS:
        key, expected, desired = fields
        if key not in data:
            if expected:
                return expected
            data[key] = desired
            return desired
        if data[key] == expected:
            data[key] = desired
        return data[key]
    if cmd == DELETE:
        return b"\x01" if data.pop(fields[0], None) is not None else b"\x00"
    if cmd == APPEND:
        data[fields[0]] = data.get(fields[0], b"") + fields[1]
        return b""
    if cmd == MULTI_SET:
        data.update(zip(wire.unpack_all(fields[0]), wire.unpack_all(fields[1]), strict=True))
        return b""
    raise wire.ProtocolError(f"unknown store command {cmd}")


def _wait_seconds(field: bytes, what: str) -> float:
    """A client's wait bound, refused unless finite and >= 0 (a NaN or infinite one killed or parked the serving
    thread: ``Condition.wait`` raises on them) and capped as every local timeout is."""
    (seconds,) = struct.unpack("<d", field)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise StoreValueError(f"{what}: timeout must be a finite number of seconds >= 0, got {seconds!r}")
    return min(seconds, MAX_TIMEOUT_S)


_ARITY = {SET: 2, GET: 2, ADD: 2, CAS: 3, WAIT: 2, DELETE: 1, NUM_KEYS: 0, CHECK: 1, APPEND: 2, MULTI_SET: 2}


class StoreServer:
    """The master's server: accept thread + one thread per authenticated client."""

    def __init__(self, host: str, port: int):
        try:
            self._sock = wire.listen(host, port, backlog=128)
        except OSError as e:
            hint = (" (another job, or an earlier run still exiting, holds it: choose another MASTER_PORT / tcp:// "
                    "port, or 0 for a free one)" if e.errno == errno.EADDRINUSE else "")
            raise DistNetworkError(f"TCPStore: cannot listen on {host}:{port}: {e.strerror or e}{hint}") from e
        self.port = self._sock.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._pid = os.getpid()
        self._gate = wire.HandshakeGate(MAX_UNAUTHENTICATED)
        self._refused = 0  # connections closed for want of a handshake place (logged once)

    def start(self, secret: bytes) -> None:
        """Serve once the secret is known (a derived secret depends on the port just bound)."""
        self._secret = secret
        threading.Thread(target=self._accept_loop, name="pt_dist-store-accept", daemon=True).start()

    def connections(self) -> int:
        """Clients connected now (each rank's store keeps one open until it closes the store or exits)."""
        return len(self._conns)

    def in_owner_process(self) -> bool:
        """False in a forked child (a DataLoader worker) holding a copy: the parent still serves."""
        return os.getpid() == self._pid

    def close(self) -> None:
        if not self.in_owner_process():  # a forked child (a DataLoader worker) collecting its copy: shutdown() would
            for sock in [self._sock, *self._conns]:  # cut the parent's sockets too, so only drop our descriptors
                sock.close()
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # threads blocked in get/wait give up now, not at their clients' timeout
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for conn in list(self._conns):
            try:  # shutdown, not just close: it wakes the thread reading it and tells the client at once
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._gate.enter(conn):  # a client refused so retries, as on a busy port
                (log.debug if self._refused else log.warning)(
                    "pt_dist store: %d connections are in their handshake already; closing new ones until some "
                    "end (a crowd of ranks starting retries; a flood of strangers is kept out)", 2 * self._gate.limit)
                self._refused += 1
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="pt_dist-store-conn", daemon=True).start()
            except RuntimeError:  # no thread to spare: refuse this one, keep accepting
                self._gate.leave(conn)
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        try:
            conn.settimeout(wire.HANDSHAKE_TIMEOUT)
            wire.server_handshake(conn, self._secret, self._gate)
            conn.settimeout(None)
            wire.tune(conn, 1 << 20)
            while True:
                frame = wire.recv_frame(conn, MAX_FRAME)
                if not frame:
                    raise wire.ProtocolError("empty frame")
                cmd = frame[0]
                if cmd not in _ARITY:
                    raise wire.ProtocolError(f"unknown store command {cmd}")
                try:  # replies lead with a status byte: 0 and the result, or 1 and why the request was refused
                    reply = b"\x00" + self._handle(cmd, wire.unpack_fields(frame[1:], _ARITY[cmd]))
                except StoreValueError as e:
                    reply = b"\x01" + str(e).encode()
                wire.send_frame(conn, reply)
        except (wire.ProtocolError, struct.error, ValueError) as e:
            log.warning("pt_dist store: dropping a connection: %s", e)
        except OSError:
            pass
        finally:
            self._conns.discard(conn)
            conn.close()

    def _handle(self, cmd: int, fields: list[bytes]) -> bytes:
        with self._cond:
            if cmd in (GET, WAIT):
                keys = [fields[0]] if cmd == GET else wire.unpack_all(fields[0])
                timeout = _wait_seconds(fields[1], "get" if cmd == GET else "wait")
                ok = self._cond.wait_for(lambda: self._closed or all(k in self._data for k in keys), timeout=timeout)
                if self._closed:  # no reply: the client hears the connection drop, not a timeout
                    raise ConnectionAbortedError("the store server closed")
                if not ok:
                    return b"\x00"
                return b"\x01" + (self._data[keys[0]] if cmd == GET else b"")
            if cmd == NUM_KEYS:
                return struct.pack("<q", len(self._data))
            if cmd == CHECK:
                keys = wire.unpack_all(fields[0])
                return b"\x01" if all(k in self._data for k in keys) else b"\x00"
            out = _apply(self._data, cmd, fields)
            self._cond.notify_all()
            return out
