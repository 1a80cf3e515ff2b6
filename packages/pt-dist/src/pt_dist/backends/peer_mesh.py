"""The socket mesh's data path: ``sendrecv`` and the header exchange, on the connections ``_infra/full_mesh.py`` made.

gloo's tcp ``Pair`` in miniature: collectives stream through one non-blocking socket per peer, ``sendrecv``
filling preallocated ``memoryview`` s with no per-chunk copies (full duplex, folding chunks as they land); each
collective starts with an all-to-all of small header frames. Point-to-point traffic gets its own sockets and
threads (``p2p.py``) so an ``isend`` never blocks behind, or interleaves with, a collective.
"""

from __future__ import annotations

import select
import selectors
import socket
import struct
import time

import torch

from pt_dist._infra import wire
from pt_dist._infra.errors import DistBackendError, missing_text
from pt_dist._infra.full_mesh import COLL, P2P, MeshSetup
from pt_dist._infra.p2p import P2PChannels
from pt_dist.work import ChannelWork, Work, callbacks_elsewhere

__all__ = ["COLL", "P2P", "PeerMesh"]
MAX_HEADER = 1 << 16


class PeerMesh:
    """One authenticated connection per peer and purpose (built by ``MeshSetup``), and what runs over them."""

    def __init__(self, store, rank: int, size: int, secret: bytes, timeout: float, group_name: str,
                 host: str = "127.0.0.1"):
        self.rank, self.size, self.timeout, self.group_name = rank, size, timeout, group_name
        self._closed = False
        self.channels = P2PChannels({}, group_name, timeout, self._fail, ChannelWork, callbacks_elsewhere)
        self.socks = MeshSetup(rank, size, timeout, group_name).connect(store, secret, host) if size > 1 else {}
        for (peer, chan), sock in self.socks.items():
            wire.tune(sock)
            sock.setblocking(chan != COLL)
            if chan == P2P:
                sock.settimeout(timeout)
                self.channels.add_peer(peer, sock)

    def set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        self.channels.set_timeout(seconds)

    def close(self) -> None:
        self._closed = True
        self.channels.stop()
        for sock in self.socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.channels.join()

    # collectives ---------------------------------------------------------------------------------
    def _fail(self, op: str, why: str, peers) -> DistBackendError:
        # the sockets' own errors (EBADF, reset, our own shutdown read as the peer's close) hide the cause
        if self._closed and not why.startswith("the group was aborted"):
            why = f"the group was aborted or shut down mid-collective ({why})"
        return DistBackendError(f"{op} on group {self.group_name!r} (rank {self.rank} of {self.size}): {why}; "
                                f"{missing_text(peers)}")

    def sendrecv(self, op: str, dst: int | None, send: memoryview | None, src: int | None,
                 recv: memoryview | None, chunk: int = 0, on_chunk=None) -> None:
        """Stream ``send`` to ``dst`` while filling ``recv`` from ``src``; either may be None.

        With ``on_chunk``, ``on_chunk(lo, hi)`` is called for each completed ``chunk``-byte range of
        ``recv`` as soon as it has arrived, so a reduction overlaps the rest of the transfer.
        """
        folded = 0
        ns = len(send) if send is not None else 0
        nr = len(recv) if recv is not None else 0
        ss = self.socks[(dst, COLL)] if ns else None
        rs = self.socks[(src, COLL)] if nr else None
        sent = got = 0
        deadline = time.monotonic() + self.timeout
        while sent < ns or got < nr:
            progressed = False
            if sent < ns:
                try:
                    sent += ss.send(send[sent:])
                    progressed = True
                except BlockingIOError:
                    pass
                except OSError as e:
                    raise self._fail(op, f"sending to rank {dst} failed ({e!r})", [dst]) from None
            if got < nr:
                try:
                    k = rs.recv_into(recv[got:])
                except BlockingIOError:
                    k = -1
                except OSError as e:
                    raise self._fail(op, f"receiving from rank {src} failed ({e!r})", [src]) from None
                if k == 0:
                    raise self._fail(op, f"rank {src} closed its connection (exited or aborted)", [src])
                if k > 0:
                    got += k
                    progressed = True
                    while on_chunk is not None and folded < got and (got - folded >= chunk or got == nr):
                        hi = min(folded + chunk, got) if got < nr else min(folded + chunk, nr)
                        on_chunk(folded, hi)
                        folded = hi
            if progressed:
                continue
            if self._closed:  # aborted from another thread: the sockets may be gone from under the poll
                raise self._fail(op, "the group was aborted or shut down mid-collective",
                                 [p for p in (src, dst) if p is not None])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = ([src] if got < nr else []) + ([dst] if sent < ns else [])
                raise self._fail(op, f"timed out after {self.timeout:.1f}s (sent {sent}/{ns} bytes to rank {dst}, "
                                 f"got {got}/{nr} from rank {src})", waiting)
            # wait only for what is still pending: a socket that is merely writable must not wake us
            poller = select.poll()
            events: dict[int, int] = {}
            if sent < ns:
                events[ss.fileno()] = select.POLLOUT
            if got < nr:
                events[rs.fileno()] = events.get(rs.fileno(), 0) | select.POLLIN
            for fd, ev in events.items():
                poller.register(fd, ev)
            poller.poll(int(min(remaining, 1.0) * 1000) + 1)

    def exchange_headers(self, op: str, header: bytes) -> list[bytes]:
        """All-to-all of small frames in one round: send ours to everyone, read everyone's at once."""
        if len(header) > MAX_HEADER:
            raise ValueError(f"{op}: collective header of {len(header)} bytes is too large")
        out = [b""] * self.size
        out[self.rank] = header
        frame = struct.pack("<I", len(header)) + header
        for peer in range(self.size):
            if peer != self.rank:
                self.sendrecv(op, peer, memoryview(frame), None, None)
        pending = {p: bytearray() for p in range(self.size) if p != self.rank}
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            for p in pending:
                sel.register(self.socks[(p, COLL)], selectors.EVENT_READ, p)
            while pending:
                if self._closed:
                    raise self._fail(op, "the group was aborted or shut down while waiting for peers", pending)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._fail(op, f"timed out after {self.timeout:.1f}s waiting for peers to join the "
                                     f"collective", pending)
                for key, _ in sel.select(min(remaining, 1.0)):
                    p = key.data
                    if p not in pending:
                        continue
                    buf = pending[p]
                    need = 4 if len(buf) < 4 else 4 + struct.unpack_from("<I", buf)[0]
                    try:
                        chunk = key.fileobj.recv(need - len(buf))
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        raise self._fail(op, f"rank {p} connection failed ({e!r})", [p]) from None
                    if not chunk:
                        raise self._fail(op, f"rank {p} closed its connection (exited or aborted)", [p])
                    buf += chunk
                    if len(buf) >= 4 and struct.unpack_from("<I", buf)[0] > MAX_HEADER:
                        raise self._fail(op, f"rank {p} sent a malformed collective header", [p])
                    if len(buf) >= 4 and len(buf) == 4 + struct.unpack_from("<I", buf)[0]:
                        out[p] = bytes(buf[4:])
                        del pending[p]
                        sel.unregister(key.fileobj)
        return out

    # point to point ------------------------------------------------------------------------------
    def p2p(self, kind: str, t: torch.Tensor, peer: int, tag: int, copy_back=None) -> Work:
        """Sends to one peer stay ordered; receives match by tag (``p2p.py``)."""
        if self._closed:
            raise DistBackendError(f"{kind} on group {self.group_name!r}: the group was shut down or failed")
        if kind == "send":
            return self.channels.send(t, peer, tag)
        return self.channels.recv(t, peer, tag, copy_back)
