"""Single-copy tensors between workers on one host: TensorPipe's ``cma`` channel (tensorpipe/channel/cma/).

Over TCP a tensor's bytes are copied twice (into the kernel, out of it). When the peer can read our memory
with ``process_vm_readv`` (same host, same pid namespace, allowed to ptrace us: pt_dist's
``_infra/cma.py``), a large tensor travels as its address instead, and the receiver copies it straight
into the tensor it allocates. Whether a peer can is probed once per connection, right after the handshake:
each side sends its pid and the address of a random token, and the other reports whether reading that
address returned the token (a pid in another namespace or a refused ptrace fails the probe, and the
connection keeps sending bytes). The sender lends the tensor until the receiver's ack says it has copied
it (rpc_transport.py); as with every TensorPipe channel, a tensor must not be modified in place while the call
that carries it is in flight.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import struct

from pt_dist._infra import wire
from pt_dist._infra.cma import CrossMemory

MIN_BYTES = int(os.environ.get("PT_DIST_RPC_CMA_BYTES", 256 << 10))
_TOKEN = ctypes.create_string_buffer(secrets.token_bytes(16), 16)
_OFFER = struct.Struct("<QQ16s")  # pid, token address, token
_PROBE = object()


def offer() -> bytes:
    """Our half of the probe: pid and where our token lives (sent to an authenticated peer only)."""
    if os.environ.get("PT_DIST_NO_CMA"):
        return _OFFER.pack(0, 0, bytes(16))
    return _OFFER.pack(os.getpid(), ctypes.addressof(_TOKEN), _TOKEN.raw)


def try_read(peer_offer: bytes) -> int:
    """The peer's pid if we can read its memory (its token read back), else 0."""
    pid, addr, token = _OFFER.unpack(peer_offer)
    cma = CrossMemory()
    if not pid or not cma.available or pid == os.getpid():
        return 0
    got = ctypes.create_string_buffer(16)
    try:
        cma.read(pid, addr, ctypes.addressof(got), 16)
    except OSError:
        return 0
    return pid if got.raw == token else 0


def exchange(sock: socket.socket, first: bool) -> tuple[int, bool]:
    """Probe both ways over a proven socket: (pid to read from or 0, whether the peer can read us).
    ``first``: the connector's side (offers first)."""
    if first:
        wire.send_frame(sock, offer())
        peer = wire.recv_frame(sock, _OFFER.size)
        readable = try_read(peer)
        wire.send_frame(sock, struct.pack("<B", bool(readable)))
        they_read = wire.recv_frame(sock, 1) == b"\x01"
    else:
        peer = wire.recv_frame(sock, _OFFER.size)
        wire.send_frame(sock, offer())
        they_read = wire.recv_frame(sock, 1) == b"\x01"
        readable = try_read(peer)
        wire.send_frame(sock, struct.pack("<B", bool(readable)))
    if len(peer) != _OFFER.size:
        raise wire.ProtocolError("malformed cross-memory offer")
    return readable, they_read
