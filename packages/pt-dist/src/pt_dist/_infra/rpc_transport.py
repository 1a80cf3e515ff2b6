"""One connection to a peer: framed messages with request ids, tensors as raw bytes behind dtype/shape headers.

The role of a TensorPipe ``Pipe`` (tensorpipe/core/pipe.h) over one TCP socket, after ``wire.py``'s
handshake. A message is a fixed header (kind, flags, tensor count, request id, size of the pickled part,
distributed-autograd context and message ids), one descriptor per tensor (dtype code, rank, requires-grad
flag, sizes, and strides for a non-contiguous tensor, which travels as the span of storage it covers so it
arrives with the same strides, as TensorPipe's does), the pickled part, then each tensor's bytes streamed in
``chunk_bytes`` pieces straight from and into the tensors' storage: no pickled tensor, no copy into one big
frame, 64-bit lengths (no 4 GiB limit).
Every size is checked against the limits before anything is allocated; a bad header raises
``wire.ProtocolError`` and that connection alone is closed (rpc_connections.py). One thread reads a connection;
any thread may send (a lock keeps messages whole), so many requests can be in flight on it at once.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
from dataclasses import dataclass, field

import torch

from pt_dist._infra import rpc_cma, wire
from pt_dist._infra.cma import CrossMemory

REQUEST, RESPONSE, ACK = 1, 2, 3  # ACK: the receiver copied the tensors a message lent by address
FLAG_ERROR = 1
HEADER = struct.Struct("<BBHIQQqq")  # kind, flags, pad, n_tensors, request id, meta bytes, autograd ctx, ag msg
DESC = struct.Struct("<BBB")  # dtype code, ndim, flags (requires_grad, by address, strided)
RG, BY_ADDRESS, STRIDED = 1, 2, 4
ADDR = struct.Struct("<Q")
MAX_TENSORS = 1 << 16
MAX_NDIM = 64
READ_AHEAD = 64 << 10

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


def _span(shape, strides) -> int:
    """Elements of storage a tensor of ``shape`` and ``strides`` covers from its first element."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def _wire_tensor(t: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
    """What goes on the wire: the tensor itself when contiguous, else the flat span of storage it covers (no
    copy) and its strides."""
    if t.device.type != "cpu":
        raise ValueError(f"RPC sends CPU tensors (no device_maps here); got one on {t.device}")
    if t.dtype not in CODE:
        raise ValueError(f"RPC cannot send dtype {t.dtype}")
    t = t.detach()
    if t.is_contiguous():
        return t, None
    flat = t.as_strided((_span(t.shape, t.stride()),), (1,), t.storage_offset())
    return flat, t.stride()


def _send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """``sendall`` of the parts in order, as few ``sendmsg`` calls (gathered writes) as the kernel allows."""
    i = 0
    while i < len(parts):
        sent = sock.sendmsg(parts[i:i + 64])
        while i < len(parts) and sent >= len(parts[i]):
            sent -= len(parts[i])
            i += 1
        if sent:
            parts[i] = parts[i][sent:]


class Connection:
    """A proven socket to peer ``peer``: ``send`` from any thread, ``recv`` from the one reader."""

    def __init__(self, sock: socket.socket, peer: int, limits: Limits, read_pid: int = 0, lend: bool = False):
        self.sock, self.peer, self.limits = sock, peer, limits
        self.read_pid, self.lend = read_pid, lend  # rpc_cma.py: we may read the peer / it may read us
        self._cma = CrossMemory() if read_pid else None
        self._lent: collections.deque = collections.deque()  # tensors lent by address, oldest first
        self._send_lock = threading.Lock()
        self._rbuf, self._rpos = bytearray(), 0
        sock.settimeout(None)
        wire.tune(sock)

    def send(self, msg: Message) -> None:
        wired = [_wire_tensor(t) for t in msg.tensors]
        tensors = [w for w, _ in wired]
        mask = msg.grad_mask or [False] * len(tensors)
        lent = [self.lend and t.numel() * t.element_size() >= rpc_cma.MIN_BYTES for t in tensors]
        head = [HEADER.pack(msg.kind, msg.flags, 0, len(tensors), msg.rid, len(msg.meta), msg.ctx_id, msg.ag_msg)]
        for (t, strides), orig, rg, by_addr in zip(wired, msg.tensors, mask, lent):
            flags = RG * bool(rg) | BY_ADDRESS * by_addr | STRIDED * (strides is not None)
            head.append(DESC.pack(CODE[t.dtype], orig.dim(), flags) + struct.pack(f"<{orig.dim()}q", *orig.shape)
                        + (struct.pack(f"<{orig.dim()}q", *strides) if strides is not None else b"")
                        + (ADDR.pack(t.data_ptr()) if by_addr else b""))
        head.append(msg.meta)
        chunk = self.limits.chunk_bytes
        parts = [memoryview(b"".join(head))]
        for t, by_addr in zip(tensors, lent):
            if not by_addr:
                v = wire.byte_view(t)
                parts.extend(v[off:off + chunk] for off in range(0, len(v), chunk))
        with self._send_lock:
            if any(lent):  # kept alive until the peer's ACK (in order: one reader copies them in order)
                self._lent.append([t for t, by_addr in zip(tensors, lent) if by_addr])
            _send_parts(self.sock, parts)

    def _read(self, n: int) -> bytes:
        """``n`` bytes, through a small buffer: a message's header, descriptors and pickle usually come in one
        ``recv`` (one system call, one GIL release, instead of one per field)."""
        buf = self._rbuf
        while len(buf) - self._rpos < n:
            if self._rpos:
                del buf[:self._rpos]
                self._rpos = 0
            got = self.sock.recv(max(READ_AHEAD, n - len(buf)))
            if not got:
                raise ConnectionResetError("peer closed the connection")
            buf += got
        out = bytes(buf[self._rpos:self._rpos + n])
        self._rpos += n
        return out

    def _read_into(self, view: memoryview) -> None:
        """Fill ``view``: what the buffer already holds, then straight from the socket into the tensor."""
        have = min(len(self._rbuf) - self._rpos, len(view))
        view[:have] = self._rbuf[self._rpos:self._rpos + have]
        self._rpos += have
        if have < len(view):
            wire.recv_into_exact(self.sock, view[have:])

    def recv(self) -> Message:
        """The next request or response; ``wire.ProtocolError`` if a header breaks a limit, ``ConnectionError`` on
        EOF. ACKs are consumed here: each releases the oldest message's lent tensors."""
        while True:
            kind, flags, _, n, rid, meta_len, ctx_id, ag_msg = HEADER.unpack(self._read(HEADER.size))
            if kind != ACK:
                break
            with self._send_lock:
                if not self._lent:
                    raise wire.ProtocolError("ACK with no tensors lent")
                self._lent.popleft()
        if kind not in (REQUEST, RESPONSE):
            raise wire.ProtocolError(f"unknown message kind {kind}")
        if n > MAX_TENSORS or meta_len > self.limits.max_meta_bytes:
            raise wire.ProtocolError(f"message of {n} tensors and {meta_len} pickled bytes exceeds the limits")
        specs, total = [], 0
        for _ in range(n):
            code, ndim, tflags = DESC.unpack(self._read(DESC.size))
            if code >= len(DTYPES) or ndim > MAX_NDIM or tflags > RG | BY_ADDRESS | STRIDED:
                raise wire.ProtocolError(f"bad tensor descriptor (dtype {code}, ndim {ndim}, flags {tflags})")
            if tflags & BY_ADDRESS and not self.read_pid:
                raise wire.ProtocolError("tensor sent by address on a connection without cross-memory access")
            shape = struct.unpack(f"<{ndim}q", self._read(8 * ndim))
            strides = struct.unpack(f"<{ndim}q", self._read(8 * ndim)) if tflags & STRIDED else None
            addr = ADDR.unpack(self._read(ADDR.size))[0] if tflags & BY_ADDRESS else None
            if any(s < 0 for s in shape) or any(s < 0 for s in strides or ()):
                raise wire.ProtocolError(f"negative tensor size {shape} or stride {strides}")
            numel = 1
            for s in shape:
                numel *= s
            if strides is not None:
                numel = _span(shape, strides)  # the storage that travels
            total += numel * DTYPES[code].itemsize
            if total > self.limits.max_message_bytes:
                raise wire.ProtocolError(f"tensors of over {total} bytes exceed the {self.limits.max_message_bytes}"
                                         f"-byte limit")
            specs.append((DTYPES[code], shape, bool(tflags & RG), addr, strides, numel))
        meta = self._read(meta_len)
        tensors = []
        for dtype, shape, _, addr, strides, numel in specs:
            t = torch.empty(shape if strides is None else (numel,), dtype=dtype)
            if addr is None:
                self._read_into(wire.byte_view(t))
            elif t.numel():
                self._cma.read(self.read_pid, addr, t.data_ptr(), t.numel() * t.element_size())
            tensors.append(t if strides is None else t.as_strided(shape, strides))
        if any(s[3] is not None for s in specs):
            with self._send_lock:
                self.sock.sendall(HEADER.pack(ACK, 0, 0, 0, 0, 0, -1, -1))
        return Message(kind, rid, meta, tensors, flags, ctx_id, ag_msg, [s[2] for s in specs])

    def close(self) -> None:
        self._lent.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
