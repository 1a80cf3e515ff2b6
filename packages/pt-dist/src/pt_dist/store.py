"""Key-value stores for rendezvous: ``Store``, ``TCPStore`` (from scratch over sockets) and ``PrefixStore``.

Mirrors c10d's Store API (torch/csrc/distributed/c10d/Store.hpp): ``set``/``get`` (blocking until the key
exists), ``add`` (atomic counter stored as decimal text), ``compare_set``, ``wait``, ``delete_key``,
``num_keys``. The TCPStore master runs a small threaded server; every connection must first pass the
shared-secret handshake in ``wire.py``, and a malformed frame closes only that connection.
"""

from __future__ import annotations

import abc
import datetime
import errno
import logging
import os
import socket
import struct
import threading
import time

from pt_dist import wire
from pt_dist.errors import DistStoreError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
MAX_FRAME = 64 << 20
_WORKERS_KEY = "__pt_dist_store_workers__"
SET, GET, ADD, CAS, WAIT, DELETE, NUM_KEYS, CHECK = range(1, 9)


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


def _b(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class Store(abc.ABC):
    """The c10d Store interface: a small shared dictionary every rank can reach."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        self._timeout = _seconds(timeout)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout)

    def set_timeout(self, timeout) -> None:
        self._timeout = _seconds(timeout)

    @abc.abstractmethod
    def set(self, key: str, value) -> None: ...

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store timeout for some rank to set it."""

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int: ...

    @abc.abstractmethod
    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        """Set ``desired`` if the current value equals ``expected`` (or the key is absent and ``expected`` is
        empty); return the value now stored (or ``expected`` when the key is absent)."""

    @abc.abstractmethod
    def wait(self, keys: list[str], timeout=None) -> None: ...

    @abc.abstractmethod
    def check(self, keys: list[str]) -> bool: ...

    @abc.abstractmethod
    def delete_key(self, key: str) -> bool: ...

    @abc.abstractmethod
    def num_keys(self) -> int: ...


class PrefixStore(Store):
    """Namespaces another store (c10d PrefixStore): each process group gets its own key space."""

    def __init__(self, prefix: str, store: Store):
        super().__init__(store.timeout)
        self.prefix, self.underlying_store = prefix, store

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key, value):
        self.underlying_store.set(self._k(key), value)

    def get(self, key):
        return self.underlying_store.get(self._k(key))

    def add(self, key, amount):
        return self.underlying_store.add(self._k(key), amount)

    def compare_set(self, key, expected_value, desired_value):
        return self.underlying_store.compare_set(self._k(key), expected_value, desired_value)

    def wait(self, keys, timeout=None):
        self.underlying_store.wait([self._k(k) for k in keys], timeout)

    def check(self, keys):
        return self.underlying_store.check([self._k(k) for k in keys])

    def delete_key(self, key):
        return self.underlying_store.delete_key(self._k(key))

    def num_keys(self):
        return self.underlying_store.num_keys()


def _apply(data: dict, cmd: int, fields: list[bytes]) -> bytes:
    """The store semantics shared by the TCP server and the file log (all non-blocking commands)."""
    if cmd == SET:
        data[fields[0]] = fields[1]
        return b""
    if cmd == ADD:
        value = int(data.get(fields[0], b"0")) + struct.unpack("<q", fields[1])[0]
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
    raise wire.ProtocolError(f"unknown store command {cmd}")


_ARITY = {SET: 2, GET: 2, ADD: 2, CAS: 3, WAIT: 2, DELETE: 1, NUM_KEYS: 0, CHECK: 1}


class _StoreServer:
    """The master's server: accept thread + one thread per authenticated client."""

    def __init__(self, host: str, port: int):
        try:
            self._sock = wire.listen(host, port, backlog=128)
        except OSError as e:
            hint = (" (another job, or an earlier run still exiting, holds it: choose another MASTER_PORT / tcp:// "
                    "port, or 0 for a free one)" if e.errno == errno.EADDRINUSE else "")
            raise DistStoreError(f"TCPStore: cannot listen on {host}:{port}: {e.strerror or e}{hint}") from e
        self.port = self._sock.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._pid = os.getpid()

    def start(self, secret: bytes) -> None:
        """Serve once the secret is known (a derived secret depends on the port just bound)."""
        self._secret = secret
        threading.Thread(target=self._accept_loop, name="pt_dist-store-accept", daemon=True).start()

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker) collecting its copy: shutdown() would
            for sock in [self._sock, *self._conns]:  # cut the parent's sockets too, so only drop our descriptors
                sock.close()
            return
        self._closed = True
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
            threading.Thread(target=self._serve, args=(conn,), name="pt_dist-store-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        try:
            conn.settimeout(wire.HANDSHAKE_TIMEOUT)
            wire.server_handshake(conn, self._secret)
            conn.settimeout(None)
            wire.tune(conn, 1 << 20)
            while True:
                frame = wire.recv_frame(conn, MAX_FRAME)
                if not frame:
                    raise wire.ProtocolError("empty frame")
                cmd = frame[0]
                if cmd not in _ARITY:
                    raise wire.ProtocolError(f"unknown store command {cmd}")
                wire.send_frame(conn, self._handle(cmd, wire.unpack_fields(frame[1:], _ARITY[cmd])))
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
                (timeout,) = struct.unpack("<d", fields[1])
                ok = self._cond.wait_for(lambda: all(k in self._data for k in keys), timeout=timeout)
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


class TCPStore(Store):
    """c10d's TCPStore rebuilt: the master (``is_master=True``) hosts the server, every rank is a client.

    ``port=0`` binds a free port (read it back from ``.port``). ``secret`` (or ``$PT_DIST_SECRET``) is the
    job's shared secret; clients that cannot prove it are dropped before any frame is parsed.
    """

    def __init__(self, host_name: str = "127.0.0.1", port: int = 0, world_size: int | None = None,
                 is_master: bool = False, timeout=DEFAULT_TIMEOUT, wait_for_workers: bool = True,
                 secret: str | bytes | None = None):
        super().__init__(timeout)
        if not is_master and port == 0:
            raise ValueError("TCPStore: a client needs the master's port, got port=0")
        if world_size is not None and world_size < 1:
            raise ValueError(f"TCPStore: world_size must be >= 1, got {world_size}")
        self.host = host_name
        self._server = _StoreServer(host_name, port) if is_master else None
        self.port = self._server.port if is_master else port
        self._secret = wire.resolve_secret(secret, f"{host_name}:{self.port}")
        if self._server is not None:
            self._server.start(self._secret)
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = [self._connect()]
        self.add(_WORKERS_KEY, 1)
        if is_master and wait_for_workers and world_size:
            try:
                self._wait_workers(world_size)
            except DistStoreError:
                self.close()  # free the port now, not whenever the half-built object is collected
                raise

    def local_address(self) -> str:
        """This host's address on the route to the store: what peers elsewhere can dial to reach us."""
        family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(addr)  # a UDP connect sends nothing: it only asks the kernel for the route
            return probe.getsockname()[0]

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(5.0, self._timeout))
                wire.client_handshake(sock, self._secret)
                sock.settimeout(None)
                wire.tune(sock, 1 << 20)
                return sock
            except wire.ProtocolError as e:
                raise DistStoreError(f"TCPStore {self.host}:{self.port}: {e}") from None
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DistStoreError(f"TCPStore: could not connect to {self.host}:{self.port} within "
                                         f"{self._timeout:.1f}s: {e}") from None
                time.sleep(0.05)

    def _call(self, cmd: int, *fields: bytes, wait_s: float = 0.0) -> bytes:
        """One request on an idle connection; a thread blocked in ``get`` never stalls another thread's ``set``."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self._connect()
        try:
            sock.settimeout(wait_s + max(30.0, self._timeout))
            wire.send_frame(sock, bytes([cmd]) + wire.pack_fields(*fields))
            reply = wire.recv_frame(sock, MAX_FRAME + 16)
        except (OSError, wire.ProtocolError) as e:
            sock.close()
            raise DistStoreError(f"TCPStore {self.host}:{self.port}: connection to the store failed: {e!r}") from None
        with self._lock:
            self._idle.append(sock)
        return reply

    def _wait_workers(self, world_size: int) -> None:
        deadline = time.monotonic() + self._timeout
        while int(self.get(_WORKERS_KEY)) < world_size:
            if time.monotonic() > deadline:
                raise DistStoreError(f"TCPStore: only {int(self.get(_WORKERS_KEY))} of {world_size} workers "
                                     f"joined within {self._timeout:.1f}s")
            time.sleep(0.01)

    def set(self, key, value):
        self._call(SET, _b(key), _b(value))

    def get(self, key):
        reply = self._call(GET, _b(key), struct.pack("<d", self._timeout), wait_s=self._timeout)
        if reply[:1] != b"\x01":
            raise DistStoreError(f"TCPStore.get({key!r}) timed out after {self._timeout:.1f}s")
        return reply[1:]

    def add(self, key, amount):
        return struct.unpack("<q", self._call(ADD, _b(key), struct.pack("<q", int(amount))))[0]

    def compare_set(self, key, expected_value, desired_value):
        return self._call(CAS, _b(key), _b(expected_value), _b(desired_value))

    def wait(self, keys, timeout=None):
        t = self._timeout if timeout is None else _seconds(timeout)
        reply = self._call(WAIT, wire.pack_fields(*map(_b, keys)), struct.pack("<d", t), wait_s=t)
        if reply != b"\x01":
            raise DistStoreError(f"TCPStore.wait({list(keys)!r}) timed out after {t:.1f}s")

    def check(self, keys):
        return self._call(CHECK, wire.pack_fields(*map(_b, keys))) == b"\x01"

    def delete_key(self, key):
        return self._call(DELETE, _b(key)) == b"\x01"

    def num_keys(self):
        return struct.unpack("<q", self._call(NUM_KEYS))[0]

    @property
    def is_master(self) -> bool:
        return self._server is not None

    def close(self, wait_for_master: float = 0.0) -> None:
        """Close this client (and the server, on the master). With ``wait_for_master``, a client first waits (up to
        that many seconds) for the master to close the server, so that nothing, such as a re-init on the same
        port, can reach the old server afterwards."""
        with self._lock:
            idle, self._idle = self._idle, []
        if wait_for_master > 0 and self._server is None and idle:
            idle[0].settimeout(wait_for_master)
            try:
                idle[0].recv(1)  # the server never speaks unasked: this returns at its close
            except OSError:
                pass
        for sock in idle:
            sock.close()
        if self._server is not None:
            self._server.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
