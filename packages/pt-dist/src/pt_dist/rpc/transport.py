"""One connection to a peer: framed messages with request ids, tensors as raw bytes behind dtype/shape headers.

The role of a TensorPipe ``Pipe`` (tensorpipe/core/pipe.h) over one TCP socket, after ``wire.py``'s
handshake. A message is a fixed header (kind, flags, tensor count, request id, size of the pickled part,
distributed-autograd context and message ids), one descriptor per tensor (dtype code, rank, requires-grad
flag, sizes), the pickled part, then each tensor's bytes streamed in ``chunk_bytes`` pieces straight from and
into the tensors' storage: no pickled tensor, no copy into one big frame, 64-bit lengths (no 4 GiB limit).
Every size is checked against the limits before anything is allocated; a bad header raises
``wire.ProtocolError`` and the agent closes that connection only. One thread reads a connection; any thread
may send (a lock keeps messages whole), so many requests can be in flight on it at once.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

import torch

from pt_dist import wire

REQUEST, RESPONSE = 1, 2
FLAG_ERROR = 1
HEADER = struct.Struct("<BBHIQQqq")  # kind, flags, pad, n_tensors, request id, meta bytes, autograd ctx, ag msg
DESC = struct.Struct("<BBB")  # dtype code, ndim, requires_grad
MAX_TENSORS = 1 << 16
MAX_NDIM = 64
SMALL = 64 << 10  # below this the tensor bytes ride in the header's sendall

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES.append(getattr(torch, _name))
CODE = {d: i for i, d in enumerate(DTYPES)}


@dataclass
class Message:
    """What travels: ``meta`` is the pickled part (tensors replaced by their index in ``tensors``)."""

    kind: int
    rid: int
    meta: bytes
    tensors: list = field(default_factory=list)
    flags: int = 0
    ctx_id: int = -1  # distributed autograd context of the sender (-1: none)
    ag_msg: int = -1  # the sender's send-function id for the tensors that require grad
    grad_mask: list = field(default_factory=list)


@dataclass(frozen=True)
class Limits:
    max_meta_bytes: int
    max_message_bytes: int
    chunk_bytes: int


def _wire_tensor(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"RPC sends CPU tensors (no device_maps here); got one on {t.device}")
    if t.dtype not in CODE:
        raise ValueError(f"RPC cannot send dtype {t.dtype}")
    return t.detach().contiguous()


class Connection:
    """A proven socket to peer ``peer``: ``send`` from any thread, ``recv`` from the one reader."""

    def __init__(self, sock: socket.socket, peer: int, limits: Limits):
        self.sock, self.peer, self.limits = sock, peer, limits
        self._send_lock = threading.Lock()
        self.closed = False
        sock.settimeout(None)
        wire.tune(sock)

    def send(self, msg: Message) -> None:
        tensors = [_wire_tensor(t) for t in msg.tensors]
        mask = msg.grad_mask or [False] * len(tensors)
        head = [HEADER.pack(msg.kind, msg.flags, 0, len(tensors), msg.rid, len(msg.meta), msg.ctx_id, msg.ag_msg)]
        for t, rg in zip(tensors, mask):
            head.append(DESC.pack(CODE[t.dtype], t.dim(), int(rg)) + struct.pack(f"<{t.dim()}q", *t.shape))
        head.append(msg.meta)
        views = [wire.byte_view(t) for t in tensors]
        small = sum(len(v) for v in views) <= SMALL
        if small:
            head.extend(bytes(v) for v in views)
        blob, chunk = b"".join(head), self.limits.chunk_bytes
        with self._send_lock:
            self.sock.sendall(blob)
            if not small:
                for v in views:
                    for off in range(0, len(v), chunk):
                        self.sock.sendall(v[off:off + chunk])

    def recv(self) -> Message:
        """The next message; ``wire.ProtocolError`` if its header breaks a limit, ``ConnectionError`` on EOF."""
        kind, flags, _, n, rid, meta_len, ctx_id, ag_msg = HEADER.unpack(wire.recv_exact(self.sock, HEADER.size))
        if kind not in (REQUEST, RESPONSE):
            raise wire.ProtocolError(f"unknown message kind {kind}")
        if n > MAX_TENSORS or meta_len > self.limits.max_meta_bytes:
            raise wire.ProtocolError(f"message of {n} tensors and {meta_len} pickled bytes exceeds the limits")
        specs, total = [], 0
        for _ in range(n):
            code, ndim, rg = DESC.unpack(wire.recv_exact(self.sock, DESC.size))
            if code >= len(DTYPES) or ndim > MAX_NDIM or rg > 1:
                raise wire.ProtocolError(f"bad tensor descriptor (dtype {code}, ndim {ndim})")
            shape = struct.unpack(f"<{ndim}q", wire.recv_exact(self.sock, 8 * ndim))
            if any(s < 0 for s in shape):
                raise wire.ProtocolError(f"negative tensor size {shape}")
            numel = 1
            for s in shape:
                numel *= s
            total += numel * DTYPES[code].itemsize
            if total > self.limits.max_message_bytes:
                raise wire.ProtocolError(f"tensors of over {total} bytes exceed the {self.limits.max_message_bytes}"
                                         f"-byte limit")
            specs.append((DTYPES[code], shape, bool(rg)))
        meta = wire.recv_exact(self.sock, meta_len)
        tensors = []
        for dtype, shape, _ in specs:
            t = torch.empty(shape, dtype=dtype)
            wire.recv_into_exact(self.sock, wire.byte_view(t))
            tensors.append(t)
        return Message(kind, rid, meta, tensors, flags, ctx_id, ag_msg, [s[2] for s in specs])

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
