"""Key-value stores for rendezvous: ``Store``, ``TCPStore`` (from scratch over sockets) and ``PrefixStore``.

Mirrors c10d's Store API (torch/csrc/distributed/c10d/Store.hpp): ``set``/``get`` (blocking until the key
exists), ``add`` (atomic counter stored as decimal text), ``compare_set``, ``wait``, ``delete_key``,
``num_keys``, ``append``, ``multi_set``/``multi_get``. The TCPStore master runs a small threaded server
(``store_server.py``); every connection must first pass the
shared-secret handshake in ``wire.py``, and a malformed frame closes only that connection.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import socket
import struct
import threading
import time
import weakref

from pt_dist._infra import secret as _secret
from pt_dist._infra import wire
from pt_dist._infra.errors import DistNetworkError, DistStoreError
from pt_dist._infra.store_server import (
    ADD,
    APPEND,
    CAS,
    CHECK,
    DELETE,
    GET,
    MAX_FRAME,
    MAX_TIMEOUT_S,
    MULTI_SET,
    NUM_KEYS,
    SET,
    WAIT,
    StoreServer,
    StoreValueError,
    check_pairs,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
_WORKERS_KEY = "__pt_dist_store_workers__"



def _seconds(timeout) -> float:
    return min(MAX_TIMEOUT_S, timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout))


def _b(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class Store:
    """The c10d Store interface: a small shared dictionary every rank can reach.

    As torch's ``Store`` for Python subclasses: the core calls raise "Not implemented." until a subclass defines
    them, and ``append`` / ``multi_get`` / ``multi_set`` fall back on ``compare_set`` / ``get`` / ``set``
    (c10d's Store.cpp), so a subclass with the core calls has them all."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        self._timeout = _seconds(timeout)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout)

    def set_timeout(self, timeout) -> None:
        self._timeout = _seconds(timeout)

    def _missing(self, call: str):
        return NotImplementedError(f"{type(self).__name__}.{call}: Not implemented.")  # (a RuntimeError, as torch's)

    def set(self, key: str, value) -> None:
        raise self._missing("set")

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store timeout for some rank to set it."""
        raise self._missing("get")

    def add(self, key: str, amount: int) -> int:
        raise self._missing("add")

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        """Set ``desired`` if the current value equals ``expected`` (or the key is absent and ``expected`` is
        empty); return the value now stored (or ``expected`` when the key is absent)."""
        raise self._missing("compare_set")

    def wait(self, keys: list[str], timeout=None) -> None:
        raise self._missing("wait")

    def check(self, keys: list[str]) -> bool:
        raise self._missing("check")

    def delete_key(self, key: str) -> bool:
        raise self._missing("delete_key")

    def num_keys(self) -> int:
        raise self._missing("num_keys")

    def has_extended_api(self) -> bool:
        """Whether ``append`` / ``multi_get`` / ``multi_set`` are the store's own (not the fallbacks)."""
        return False

    def append(self, key: str, value) -> None:
        """Add ``value`` to the end of ``key``'s value (created if absent), atomically: by ``compare_set`` until no
        other writer came between, as c10d's fallback."""
        value, current = _b(value), b""
        expected = value
        current = _b(self.compare_set(key, current, expected))
        while current != expected:
            expected = current + value
            current = _b(self.compare_set(key, current, expected))

    def multi_set(self, keys: list[str], values: list) -> None:
        """Set every key (the stores' own: in one request, so no rank sees half of them)."""
        check_pairs(keys, values)
        for k, v in zip(keys, values):
            self.set(k, v)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Every key's value, each waited for as ``get`` does."""
        return [self.get(k) for k in keys]


class PrefixStore(Store):
    """Namespaces another store (c10d PrefixStore): each process group gets its own key space."""

    def __init__(self, prefix: str, store: Store):
        if store is None:  # torch's check: every later call would fail far from here
            raise ValueError("PrefixStore: store argument cannot be None")
        super().__init__(store.timeout)
        self.prefix, self.underlying_store = prefix, store

    @property
    def _underlying_non_prefix_store(self) -> Store:
        """The store under every level of prefixes (torch's)."""
        store = self.underlying_store
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        return store

    def has_extended_api(self):
        return self.underlying_store.has_extended_api()

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    # values reach the store under it as bytes, as c10d's PrefixStore (a str arrives there encoded)
    def set(self, key, value):
        self.underlying_store.set(self._k(key), _b(value))

    def get(self, key):
        return self.underlying_store.get(self._k(key))

    def add(self, key, amount):
        return self.underlying_store.add(self._k(key), amount)

    def compare_set(self, key, expected_value, desired_value):
        return self.underlying_store.compare_set(self._k(key), _b(expected_value), _b(desired_value))

    def wait(self, keys, timeout=None):
        self.underlying_store.wait([self._k(k) for k in keys], timeout)

    def check(self, keys):
        return self.underlying_store.check([self._k(k) for k in keys])

    def delete_key(self, key):
        return self.underlying_store.delete_key(self._k(key))

    def num_keys(self):
        return self.underlying_store.num_keys()

    def append(self, key, value):
        self.underlying_store.append(self._k(key), _b(value))

    def multi_set(self, keys, values):
        self.underlying_store.multi_set([self._k(k) for k in keys], [_b(v) for v in values])

    def multi_get(self, keys):
        return self.underlying_store.multi_get([self._k(k) for k in keys])


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every TCPStore of this process, for the exit below


@atexit.register
def _serve_until_peers_leave() -> None:
    """At exit, a process hosting a store serves it until every other process has closed its connection (exited
    or destroyed its group), up to the store's timeout. torchrun's agent hosts torch's store and outlives the
    workers; a rank that hosts ours and is done first (rank 0 of the DeviceMesh recipe's hand-built ``new_group``
    layout, not a member of the last group) must not take the store from ranks still building groups on it."""
    stores = list(_LIVE)
    for store in stores:  # this process's own connections first: they are not peers
        with store._lock:
            idle, store._idle = store._idle, []
        for sock in idle:
            sock.close()
    for store in stores:
        server = store._server
        if server is None or not server.in_owner_process():
            continue
        deadline, logged = time.monotonic() + store._timeout, False
        while server.connections() and time.monotonic() < deadline:
            if not logged:
                log.info("pt_dist store %s:%s: serving %d peer(s) still connected before exiting", store.host,
                         store.port, server.connections())
                logged = True
            time.sleep(0.02)


class _Tenant:
    """The stores of this process that share one server on host:port (torch's multi-tenant TCPStore:
    ``init_process_group`` and ``rpc.init_rpc`` on the same MASTER_PORT); the last to close stops it."""

    _servers: dict[tuple[str, int], _Tenant] = {}
    _lock = threading.Lock()

    def __init__(self, key: tuple[str, int], server: StoreServer, secret: bytes, secret_file) -> None:
        self.key, self.server, self.secret, self.secret_file, self.stores = key, server, secret, secret_file, 1

    @classmethod
    def register(cls, host: str, port: int, server: StoreServer, secret: bytes, secret_file, shared: bool
                 ) -> _Tenant:
        """A new server's tenancy (found by later multi-tenant masters on host:port if ``shared``)."""
        tenant = cls((host, port), server, secret, secret_file)
        if shared:
            with cls._lock:
                cls._servers[(host, port)] = tenant
        return tenant

    def leave(self) -> bool:
        """One store fewer; True when it was the last (the caller stops the server)."""
        with self._lock:
            self.stores -= 1
            if self.stores > 0:
                return False
            if self._servers.get(self.key) is self:
                del self._servers[self.key]
            return True


def _tenant_of(host: str, port: int, secret: bytes | None) -> _Tenant | None:
    """The server this process already runs on ``host:port`` (None: none, or port 0), one more store on it."""
    with _Tenant._lock:
        tenant = _Tenant._servers.get((host, port)) if port else None
        if tenant is None or not tenant.server.in_owner_process():
            return None
        if secret is not None and secret != tenant.secret:
            raise ValueError(f"TCPStore {host}:{port}: this process already serves the store with another secret")
        tenant.stores += 1
        return tenant


class TCPStore(Store):
    """c10d's TCPStore rebuilt: the master (``is_master=True``) hosts the server, every rank is a client.

    ``port=0`` binds a free port (read it back from ``.port``). ``multi_tenant``: a master on a port another
    multi-tenant store of this process serves shares that server (as torch's, which rendezvous uses).
    ``secret`` (or ``$PT_DIST_SECRET``) is the job's shared secret; without one, the master draws a random one
    that ranks on its host read from a private file (``secret.py``). Clients that cannot prove it are dropped
    before any frame is parsed.
    """

    def __init__(self, host_name: str = "127.0.0.1", port: int = 0, world_size: int | None = None,
                 is_master: bool = False, timeout=DEFAULT_TIMEOUT, wait_for_workers: bool = True,
                 multi_tenant: bool = False, secret: str | bytes | None = None):
        super().__init__(timeout)
        if world_size is not None and world_size < 1:
            raise ValueError(f"TCPStore world size cannot be {world_size}: want >= 1, or None for any")
        if not is_master and port == 0:
            raise ValueError("TCPStore: a client needs the master's port, got port=0")
        self.host, self._secret_file, self._is_master = host_name, None, is_master
        self._secret = _secret.given(secret)
        if self._secret is None:
            _secret.refuse_multi_host(host_name, port)  # before binding or connecting anything
        tenant = _tenant_of(host_name, port, self._secret) if is_master and multi_tenant else None
        self._server = tenant.server if tenant else StoreServer(host_name, port) if is_master else None
        self.port = self._server.port if is_master else port
        if tenant is not None:  # another store of this process serves host:port: share it (its secret, its data)
            self._secret, self._tenant = tenant.secret, tenant
        if self._secret is None and _secret.insecure():
            self._secret = _secret.derived(host_name, self.port)
        if self._server is not None and tenant is None:
            if self._secret is None:
                try:
                    self._secret, self._secret_file = _secret.publish(self.port)
                except BaseException:
                    self._server.close()
                    raise
            self._server.start(self._secret)
            self._tenant = _Tenant.register(host_name, self.port, self._server, self._secret, self._secret_file,
                                            shared=multi_tenant)
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = [self._connect()]
        _LIVE.add(self)
        self.add(_WORKERS_KEY, 1)
        if is_master and wait_for_workers and world_size:
            try:
                self._wait_workers(world_size)
            except BaseException:
                self.close()  # free the port now, not whenever the half-built object is collected
                raise

    def local_address(self) -> str:
        """This host's address on the route to the store: what peers elsewhere can dial to reach us."""
        family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(addr)  # a UDP connect sends nothing: it only asks the kernel for the route
            return probe.getsockname()[0]

    def _connect(self) -> socket.socket:
        """A proven connection. A secret read from the master's file is read again on each try: the master may not
        have written it yet, or a dead master's file may still be there until the new one replaces it."""
        deadline, from_file = time.monotonic() + self._timeout, self._secret is None
        while True:
            secret = self._secret or _secret.read(self.port)
            try:
                if secret is None:
                    raise FileNotFoundError(f"no secret published for port {self.port} in {_secret.runtime_dir()} "
                                            f"(the master not up yet, started by another user, or given its own "
                                            f"secret: then pass the same secret= or set {_secret.SECRET_ENV})")
                sock = socket.create_connection((self.host, self.port), timeout=min(5.0, self._timeout))
                try:
                    wire.client_handshake(sock, secret)
                except BaseException:
                    sock.close()
                    raise
                sock.settimeout(None)
                wire.tune(sock, 1 << 20)
                self._secret = secret
                return sock
            except wire.ProtocolError as e:
                if not from_file or time.monotonic() > deadline:
                    raise DistNetworkError(f"TCPStore {self.host}:{self.port}: {e}") from None
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DistNetworkError(f"TCPStore: could not connect to {self.host}:{self.port} within "
                                           f"{self._timeout:.1f}s: {e}") from None
            time.sleep(0.05)

    def _call(self, cmd: int, *fields: bytes, wait_s: float = 0.0) -> bytes:
        """One request on an idle connection; a thread blocked in ``get`` never stalls another thread's ``set``."""
        request = bytes([cmd]) + wire.pack_fields(*fields)
        if len(request) > MAX_FRAME:  # the server would drop the connection: say why here, before sending
            raise ValueError(f"TCPStore: a request of {len(request)} bytes exceeds the store's {MAX_FRAME}-byte "
                             f"frame limit; the store is for rendezvous metadata, move tensors with collectives")
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self._connect()
        try:
            sock.settimeout(wait_s + max(30.0, self._timeout))
            wire.send_frame(sock, request)
            reply = wire.recv_frame(sock, MAX_FRAME + 16)
        except (OSError, wire.ProtocolError) as e:
            sock.close()
            raise DistNetworkError(f"TCPStore {self.host}:{self.port}: connection to the store failed: {e!r}") from None
        with self._lock:
            self._idle.append(sock)
        if reply[:1] == b"\x01":
            raise StoreValueError(f"TCPStore {self.host}:{self.port}: {reply[1:].decode(errors='replace')}")
        return reply[1:]

    def _wait_workers(self, world_size: int) -> None:
        deadline = time.monotonic() + self._timeout
        while int(self.get(_WORKERS_KEY)) < world_size:
            if time.monotonic() > deadline:
                raise DistStoreError(f"TCPStore: Timed out after {self._timeout:g} seconds waiting for clients. "
                                     f"{int(self.get(_WORKERS_KEY))}/{world_size} clients joined.")  # torch's words
            time.sleep(0.01)

    def set(self, key, value):
        self._call(SET, _b(key), _b(value))

    def get(self, key):
        reply = self._call(GET, _b(key), struct.pack("<d", max(0.0, self._timeout)), wait_s=self._timeout)
        if reply[:1] != b"\x01":
            raise DistStoreError(f"TCPStore.get({key!r}) timed out after {self._timeout:.1f}s")
        return reply[1:]

    def add(self, key, amount):
        return struct.unpack("<q", self._call(ADD, _b(key), struct.pack("<q", int(amount))))[0]

    def compare_set(self, key, expected_value, desired_value):
        return self._call(CAS, _b(key), _b(expected_value), _b(desired_value))

    def wait(self, keys, timeout=None):
        t = self._timeout if timeout is None else _seconds(timeout)
        reply = self._call(WAIT, wire.pack_fields(*map(_b, keys)), struct.pack("<d", max(0.0, t)), wait_s=t)
        if reply != b"\x01":
            raise DistStoreError(f"TCPStore.wait({list(keys)!r}) timed out after {t:.1f}s")

    def check(self, keys):
        return self._call(CHECK, wire.pack_fields(*map(_b, keys))) == b"\x01"

    def delete_key(self, key):
        return self._call(DELETE, _b(key)) == b"\x01"

    def num_keys(self):
        return struct.unpack("<q", self._call(NUM_KEYS))[0]

    def has_extended_api(self):
        return True

    def append(self, key, value):
        self._call(APPEND, _b(key), _b(value))

    def multi_set(self, keys, values):
        check_pairs(keys, values)
        self._call(MULTI_SET, wire.pack_fields(*map(_b, keys)), wire.pack_fields(*map(_b, values)))

    @property
    def is_master(self) -> bool:
        return self._is_master

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
        server, self._server = self._server, None  # (closed once: __del__ closes again)
        if server is not None and self._tenant.leave():  # the last store of this process on the server
            if self._tenant.secret_file is not None and server.in_owner_process():
                _secret.unpublish(self._tenant.secret_file, self._tenant.secret)
            server.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
