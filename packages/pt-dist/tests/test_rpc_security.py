"""The RPC listener against strangers: no secret, no execution; garbage closes only that connection.

No upstream counterpart (torch's TensorPipe agent accepts any connection that reaches its port); these are the
threat model of docs/rpc.md: loopback by default, the shared-secret handshake before any frame is decoded,
per-connection failure on malformed or oversized frames.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
from pathlib import Path

import pt_dist.rpc as rpc
import pytest
import torch
from pt_dist._infra import wire
from pt_dist._infra.rpc_transport import HEADER, REQUEST, RESPONSE, Connection, Limits, Message
from pt_dist.rpc.rpc_agent import get_current_rpc_agent

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402


def touch(path):
    with open(path, "w") as f:
        f.write("executed")
    return True


def _until_closed(s) -> bytes:
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _address(store, rank):
    _, host, port = bytes(store.get(f"rpc/worker/{rank}")).decode().split("\n")
    return host, int(port)


def _strangers(rank, world_size, marker):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {"bound": get_current_rpc_agent().connections.listener.sock.getsockname()[0]}
        host, port = _address(store, 1)
        call = pickle.dumps(("call", touch, (marker,), {}))
        # 1. no secret: a request frame right away is read as the handshake answer and refused
        with socket.create_connection((host, port), timeout=5) as s:
            s.recv(20)
            s.sendall(HEADER.pack(REQUEST, 0, 0, 0, 1, len(call), -1, -1) + call)
            out["no_secret"] = s.recv(16)
        # 2. a wrong secret, through the real handshake
        with socket.create_connection((host, port), timeout=5) as s:
            try:
                wire.client_handshake(s, b"not the job's secret")
            except wire.ProtocolError as e:
                out["wrong_secret"] = str(e)
        # 3. random bytes
        with socket.create_connection((host, port), timeout=5) as s:
            greeting = s.recv(20)
            s.sendall(os.urandom(4096))
            out["random"] = _until_closed(s)
            out["greeting"] = greeting[:4]
        # 4. the secret, then a hello naming a rank that is not free: closed after the handshake
        secret = bytes(store.get("rpc/secret"))
        with socket.create_connection((host, port), timeout=5) as s:
            wire.client_handshake(s, secret)
            wire.send_frame(s, struct.pack("<I", 1))
            s.sendall(HEADER.pack(REQUEST, 0, 0, 0, 1, len(call), -1, -1) + call)
            try:
                out["taken_rank"] = s.recv(16)
            except ConnectionResetError:
                out["taken_rank"] = b""
        out["refused"] = rpc.rpc_sync("worker1", _refused)
        out["still_serving"] = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
        out["marker"] = os.path.exists(marker)
        return out
    finally:
        util.stop(store)


def _refused():
    return get_current_rpc_agent().connections.listener.refused


def test_strangers_are_refused_and_nothing_runs(tmp_path):
    marker = str(tmp_path / "executed")
    out = run_ranks(_strangers, 2, marker, backend=None, timeout=60)[0]
    assert out["bound"] == "127.0.0.1"
    assert out["no_secret"] == b"NO"
    assert "refused our shared secret" in out["wrong_secret"]
    assert out["greeting"] == wire.MAGIC and out["random"] == b"NO"  # refused, then closed
    assert out["taken_rank"] == b""
    assert out["refused"] == 4, out["refused"]
    assert torch.equal(out["still_serving"], torch.full((2,), 2.0))
    assert out["marker"] is False and not os.path.exists(marker)


def _pair():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    return a, Connection(b, 1, Limits(max_meta_bytes=1 << 10, max_message_bytes=1 << 20, chunk_bytes=1 << 12))


@pytest.mark.parametrize("case", ["kind", "meta", "tensors", "dims", "dtype"])
def test_malformed_or_oversized_frames_raise_before_allocating(case):
    raw, conn = _pair()
    with raw:
        if case == "kind":
            raw.sendall(HEADER.pack(9, 0, 0, 0, 1, 0, -1, -1))
        elif case == "meta":
            raw.sendall(HEADER.pack(REQUEST, 0, 0, 0, 1, 1 << 40, -1, -1))
        elif case == "tensors":  # 2 ** 40 bytes of float32 announced: refused by the header alone
            raw.sendall(HEADER.pack(REQUEST, 0, 0, 1, 1, 0, -1, -1) + struct.pack("<BBB", 0, 1, 0)
                        + struct.pack("<q", 1 << 38))
        elif case == "dims":
            raw.sendall(HEADER.pack(REQUEST, 0, 0, 1, 1, 0, -1, -1) + struct.pack("<BBB", 0, 1, 0)
                        + struct.pack("<q", -5))
        else:
            raw.sendall(HEADER.pack(REQUEST, 0, 0, 1, 1, 0, -1, -1) + struct.pack("<BBB", 200, 1, 0))
        with pytest.raises(wire.ProtocolError):
            conn.recv()
    conn.close()


def test_a_well_formed_frame_round_trips_through_the_same_checks():
    raw, conn = _pair()
    other = Connection(raw, 0, conn.limits)
    t = torch.arange(3000, dtype=torch.float32)  # 12 kB: past the 4 kB chunks
    other.send(Message(REQUEST, 7, b"meta", [t, torch.ones(2, dtype=torch.bool)], ctx_id=5))
    got = conn.recv()
    assert (got.kind, got.rid, got.meta, got.ctx_id) == (REQUEST, 7, b"meta", 5)
    assert torch.equal(got.tensors[0], t) and got.tensors[1].dtype == torch.bool
    other.close()
    conn.close()


def test_tensors_lent_by_address_are_copied_and_released_on_ack():
    """The cross-memory path of one connection (reading our own process, which the probe itself refuses)."""
    raw, conn = _pair()
    sender = Connection(raw, 0, conn.limits, read_pid=os.getpid(), lend=True)
    receiver = Connection(conn.sock, 1, conn.limits, read_pid=os.getpid(), lend=True)
    big, small = torch.arange(1 << 17, dtype=torch.float32), torch.ones(3)  # 512 KiB goes by address
    sender.send(Message(REQUEST, 1, b"m", [big, small]))
    assert len(sender._lent) == 1 and sender._lent[0][0].data_ptr() == big.data_ptr()
    got = receiver.recv()
    assert torch.equal(got.tensors[0], big) and got.tensors[0].data_ptr() != big.data_ptr()
    assert torch.equal(got.tensors[1], small)
    receiver.send(Message(RESPONSE, 1, b"r", []))
    assert sender.recv().kind == RESPONSE and len(sender._lent) == 0  # the ACK came first and released it
    sender.close()
    receiver.close()


def test_a_connection_without_cross_memory_refuses_an_address():
    raw, conn = _pair()
    with raw:
        raw.sendall(HEADER.pack(REQUEST, 0, 0, 1, 1, 0, -1, -1) + struct.pack("<BBB", 0, 1, 2)
                    + struct.pack("<q", 4) + struct.pack("<Q", 4096))
        with pytest.raises(wire.ProtocolError, match="by address"):
            conn.recv()
    conn.close()
