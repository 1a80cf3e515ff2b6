"""Bytes on the wire: exact reads, length-prefixed fields and the shared-secret handshake.

Every socket pt_dist opens (store and backend mesh) starts with a mutual challenge-response: the listener
sends a random nonce, the connector answers ``HMAC-SHA256(secret, "client" + nonce)`` with a nonce of its
own, and the listener answers that in turn (the keyed-hash handshake of ``multiprocessing.connection``, both
ways). Nothing else is read from a connection before the connector has proven the secret, so a stranger on
the port can neither inject a tensor nor reach a parser; and a connector trusts nothing from a listener that
has not proven it, so an impostor on the store's address cannot feed ranks keys. The whole handshake has one
deadline, so a stranger dripping a byte at a time holds its place no longer than a silent one. Frames are
plain length-prefixed binary (no pickle anywhere).
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import socket
import struct
import threading
import time

import torch

MAGIC = b"PTD2"  # 2: the listener proves the secret too
NONCE_BYTES = 16
DIGEST_BYTES = 32
HANDSHAKE_TIMEOUT = 10.0


class ProtocolError(ConnectionError):
    """The peer sent something that is not a well-formed frame (or failed the handshake)."""


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf), deadline)
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view``; with a ``deadline`` (``time.monotonic()``), all of it before then (a socket timeout bounds
    each read, not their sum)."""
    got, n = 0, len(view)
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"deadline passed with {got} of {n} bytes received")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError("peer closed the connection")
        got += k


def _proof(secret: bytes, who: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, who + b"".join(nonces), hashlib.sha256).digest()


def server_handshake(sock: socket.socket, secret: bytes, gate: HandshakeGate | None = None) -> None:
    """Challenge the connector; raise ``ProtocolError`` (caller closes) unless it proves the secret (and, with a
    ``gate``, unless the gate cut it off meanwhile: checked before the connector hears it is in; the connection
    leaves the gate either way). Leaves the socket's timeout at what is left of the handshake's."""
    try:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        nonce = os.urandom(NONCE_BYTES)
        sock.sendall(MAGIC + nonce)
        answer = recv_exact(sock, DIGEST_BYTES + NONCE_BYTES, deadline)
        if not hmac.compare_digest(answer[:DIGEST_BYTES], _proof(secret, b"client", nonce)):
            sock.sendall(b"NO")
            raise ProtocolError("client failed the shared-secret handshake")
        if gate is not None and not gate.leave(sock):
            raise ProtocolError("cut off in the handshake to make room for newer connections")
        sock.sendall(b"OK" + _proof(secret, b"server", answer[DIGEST_BYTES:], nonce))
    finally:
        if gate is not None:
            gate.leave(sock)  # (a no-op after the check above)


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Prove the secret to the listener and have it prove the secret back. ``ProtocolError``: refused, or not
    the endpoint we meant (do not retry); another ``OSError``: the listener closed on us (busy; retry)."""
    head = recv_exact(sock, len(MAGIC) + NONCE_BYTES)
    if head[: len(MAGIC)] != MAGIC:
        raise ProtocolError(f"not a pt_dist endpoint of this version (greeting {head[:4]!r}, want {MAGIC!r})")
    mine = os.urandom(NONCE_BYTES)
    sock.sendall(_proof(secret, b"client", head[len(MAGIC):]) + mine)
    verdict = recv_exact(sock, 2)
    if verdict == b"NO":
        raise ProtocolError("the server refused our shared secret (PT_DIST_SECRET differs?)")
    if verdict != b"OK" or not hmac.compare_digest(recv_exact(sock, DIGEST_BYTES),
                                                   _proof(secret, b"server", mine, head[len(MAGIC):])):
        raise ProtocolError("the server did not prove the shared secret: not this job's (an impostor at the "
                            "address, or PT_DIST_SECRET differs)")


class HandshakeGate:
    """Bounds the connections in their handshake (each has a thread reading it) without letting silent ones
    lock the door: past ``limit`` waiting, the oldest is cut to make room. A client that holds the secret
    answers the nonce within a round trip, so only a silent or stuck one gets that old, and a flood of them
    cannot keep the job's own clients out for the handshake timeout. Threads stay bounded: with
    ``2 * limit`` handshakes still running (cut ones end at once), a newcomer is refused and retries."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, bool] = {}  # in arrival order: True while waiting, False once cut

    def enter(self, conn: socket.socket) -> bool:
        """Admit ``conn`` (False: refused, close it), cutting the oldest waiting one if the gate is full."""
        with self._lock:
            if len(self._conns) >= 2 * self.limit:
                return False
            waiting = [c for c, w in self._conns.items() if w]
            oldest = waiting[0] if len(waiting) >= self.limit else None
            if oldest is not None:
                self._conns[oldest] = False
            self._conns[conn] = True
        if oldest is not None:
            try:  # wakes the thread reading it, which fails its handshake and leaves
                oldest.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return True

    def leave(self, conn: socket.socket) -> bool:
        """The handshake of ``conn`` is over: True if it was still waiting (not cut). Repeat calls return False."""
        with self._lock:
            return self._conns.pop(conn, False)


def pack_fields(*fields: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in fields)


def unpack_fields(buf: bytes, count: int) -> list[bytes]:
    """Split ``count`` length-prefixed fields; a short or overlong buffer is a ``ProtocolError``."""
    out, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(buf):
            raise ProtocolError("truncated frame")
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if pos + n > len(buf):
            raise ProtocolError("field runs past the frame")
        out.append(buf[pos:pos + n])
        pos += n
    if pos != len(buf):
        raise ProtocolError("trailing bytes in frame")
    return out


def unpack_all(buf: bytes) -> list[bytes]:
    """Every length-prefixed field in ``buf`` (validated like ``unpack_fields``)."""
    pos, count = 0, 0
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise ProtocolError("truncated field list")
        pos += 4 + struct.unpack_from("<I", buf, pos)[0]
        count += 1
    return unpack_fields(buf, count)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("<I", len(payload)) + payload)


def recv_frame(sock: socket.socket, max_bytes: int) -> bytes:
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    if n > max_bytes:
        raise ProtocolError(f"frame of {n} bytes exceeds the {max_bytes}-byte limit")
    return recv_exact(sock, n)


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host`` (an IPv4 or IPv6 address or a name; ``::`` also takes IPv4 where the
    system allows), as c10d's TCPStore takes either family."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    dual = family == socket.AF_INET6 and host in ("::", "") and socket.has_dualstack_ipv6()
    return socket.create_server((host, port), family=family, backlog=backlog, dualstack_ipv6=dual)


def tune(sock: socket.socket, bufsize: int = 4 << 20) -> None:
    """No Nagle delay on small control frames; big kernel buffers so large chunks stream."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
        except OSError:
            pass


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's storage (zero-size tensors give an empty view).

    Through ctypes rather than ``Tensor.numpy()``: torch does not depend on numpy, so neither do we."""
    if t.numel() == 0:
        return memoryview(bytearray(0))
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"byte_view needs a contiguous CPU tensor, got {t.dtype}{list(t.shape)} on {t.device}")
    raw = (ctypes.c_ubyte * (t.numel() * t.element_size())).from_address(t.data_ptr())
    raw._tensor = t  # the view keeps the tensor's memory alive
    return memoryview(raw).cast("B")
