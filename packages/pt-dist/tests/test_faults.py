"""Faults on the native backends: a peer that dies mid-collective, one that never arrives, mismatched calls.

The dying peer is a child that rank 0 forks (so the harness ranks all finish and report what they saw);
it joins the group as rank 2, starts a large all_reduce and exits in the middle of it.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistBackendError, DistError, ReduceOp, TCPStore
from pt_dist._infra import wire
from pt_dist._infra.store import PrefixStore
from pt_dist.backends.tcp import ProcessGroupTCP

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402

BACKENDS = ["tcp", "shm"]


def _mismatch(rank, world_size, backend):
    util.join(rank, world_size, backend, key="mismatch")
    cases = {
        "shape": lambda: pt_dist.all_reduce(torch.ones(5 if rank == 2 else 4)),
        "dtype": lambda: pt_dist.all_reduce(torch.ones(4, dtype=torch.float64 if rank == 1 else torch.float32)),
        "op": lambda: pt_dist.all_reduce(torch.ones(4), op=ReduceOp.MAX if rank == 0 else ReduceOp.SUM),
        "collective": lambda: (pt_dist.broadcast(torch.ones(4), 0) if rank == 0 else pt_dist.all_reduce(torch.ones(4))),
        "root": lambda: pt_dist.broadcast(torch.ones(4), src=rank % 2),
        # large enough for shm's sliced path, whose header rides in the first data barrier
        "large shape": lambda: pt_dist.all_reduce(torch.ones(300_001 if rank == 1 else 300_000)),
        "large vs small": lambda: pt_dist.all_reduce(torch.ones(8 if rank == 0 else 300_000)),
        "large vs broadcast": lambda: (pt_dist.broadcast(torch.ones(4), 0) if rank == 2
                                       else pt_dist.all_reduce(torch.ones(300_000))),
        "large after broadcast": lambda: (pt_dist.broadcast(torch.ones(4), 0),
                                          pt_dist.all_reduce(torch.ones(300_001 if rank == 1 else 300_000))),
        "splits": lambda: pt_dist.all_to_all_single(torch.empty(3), torch.ones(3),
                                                    [1, 1, 1], [2, 1, 0] if rank == 1 else [1, 1, 1]),
        # rows of 3 elements sent, rows of 2 expected: once cut short on shm, a local error breaking tcp's group
        "row size": lambda: pt_dist.all_to_all_single(torch.empty(3, 2), torch.ones(3, 3)),
    }
    seen = {}
    for name, call in cases.items():
        try:
            call()
            seen[name] = None
        except torch.distributed.DistBackendError as e:  # torch's own class catches ours (it is its base)
            assert isinstance(e, DistBackendError) and isinstance(e, DistError), type(e).__mro__
            seen[name] = str(e)
    ok = torch.full((6,), float(rank))
    pt_dist.all_reduce(ok)  # the group survives a detected mismatch
    util.leave()
    return seen, ok.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_calls_raise_on_every_rank_and_the_group_goes_on(backend):
    for seen, ok in run_ranks(_mismatch, 3, backend, backend=None, timeout=90):
        for name, msg in seen.items():
            assert msg is not None, f"{name} mismatch went unnoticed"
            assert "rank" in msg
        assert "float64" in seen["dtype"] and "[5]" in seen["shape"]
        assert ok == [3.0] * 6


def _child_dies(port: int, backend: str, when: str) -> None:
    code = 1
    try:
        torch.set_num_threads(1)
        store = TCPStore("127.0.0.1", port, timeout=30)
        pt_dist.init_process_group(backend, store=store, rank=2, world_size=3, timeout=20)
        pt_dist.all_reduce(torch.ones(8))
        # die inside the next collective, after its header round: at the second reduce-scatter step (tcp:
        # two header sends, then ring steps), at shm's last barrier (16 MiB takes the single-copy path:
        # header + address barrier, cross-memory copies, closing barrier), or right after shm's first
        # barrier, so the survivors' cross-memory copies meet a dying process
        pg = pt_dist.GroupMember.WORLD
        target, name, fatal = (pg.mesh, "sendrecv", 4) if backend == "tcp" else (pg.counters, "arrive_and_wait", 2)
        real, calls = getattr(target, name), []

        def dying(*args, **kwargs):
            calls.append(1)
            if len(calls) == fatal and when == "before":
                os._exit(0)
            out = real(*args, **kwargs)
            if len(calls) == 1 and when == "after first barrier":
                os._exit(0)
            return out

        setattr(target, name, dying)
        pt_dist.all_reduce(torch.ones(4 << 20))
    finally:
        os._exit(code)


def _survivors(rank, world_size, backend, when):
    child = None
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False, timeout=30)
        harness.store().set("fault_port", str(store.port))
        child = os.fork()
        if child == 0:
            _child_dies(store.port, backend, when)
    else:
        store = TCPStore("127.0.0.1", int(harness.store().get("fault_port")), timeout=30)
    try:
        pt_dist.init_process_group(backend, store=store, rank=rank, world_size=3, timeout=20)
        warm = torch.ones(8)
        pt_dist.all_reduce(warm)
        assert warm.eq(3).all()
        t0 = time.monotonic()
        try:
            pt_dist.all_reduce(torch.ones(4 << 20))
            first = None
        except DistBackendError as e:
            first = str(e)
        elapsed = time.monotonic() - t0
        try:
            pt_dist.all_reduce(torch.ones(2))
            second = None
        except DistBackendError as e:
            second = str(e)
        pt_dist.destroy_process_group()
        # the child left through the planted os._exit(0), i.e. mid-collective, not through an error (1)
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) if child else 0
        return first, elapsed, second, status
    finally:
        if pt_dist.is_initialized():
            pt_dist.destroy_process_group()


@pytest.mark.parametrize("backend,when", [("tcp", "before"), ("shm", "before"), ("shm", "after first barrier")])
def test_rank_exiting_mid_collective_makes_the_others_raise(backend, when):
    for first, elapsed, second, child_status in run_ranks(_survivors, 2, backend, when, backend=None, timeout=90):
        assert child_status == 0
        assert first is not None, "the collective with a dead peer must fail"
        assert "all_reduce" in first and "default_pg" in first and "missing ranks" in first, first
        assert elapsed < 10, f"took {elapsed:.1f}s, the group timeout is 20s: death must be noticed early"
        assert second is not None and "unusable" in second


def _absent(rank, world_size, backend):
    util.join(rank, world_size, backend, timeout=1.5, key="absent")
    try:
        if rank == 1:  # never joins the collective; leaves once rank 0 has given up
            harness.store().get("absent_done")
            return None
        t0 = time.monotonic()
        try:
            pt_dist.all_reduce(torch.ones(10))
        except DistBackendError as e:
            return str(e), time.monotonic() - t0
        finally:
            harness.store().set("absent_done", "1")
        return None, time.monotonic() - t0
    finally:
        pt_dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_that_never_arrives_times_out_with_dist_error(backend):
    (msg, elapsed), _ = run_ranks(_absent, 2, backend, backend=None, timeout=60)
    assert msg is not None and "timed out" in msg and "missing ranks [1]" in msg and "all_reduce" in msg, msg
    assert 1.4 < elapsed < 8


def test_mesh_refuses_strangers_and_still_forms():
    """A wrong-secret connector and a garbage sender hit rank 0's listener during setup; the group forms anyway."""
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10, secret=b"s")
    groups = [None, None]

    def make(rank):
        store = PrefixStore("pg", TCPStore("127.0.0.1", master.port, timeout=10, secret=b"s"))
        groups[rank] = ProcessGroupTCP(store, rank, 2, 10.0, "pg", secret=b"mesh-secret")

    t0 = threading.Thread(target=make, args=(0,))
    t0.start()
    host, port = master.get("pg/mesh/0").decode().split()[1].rsplit(":", 1)  # "<group size> host:port"
    stranger = socket.create_connection((host, int(port)), timeout=5)
    with pytest.raises(wire.ProtocolError, match="refused"):
        wire.client_handshake(stranger, b"wrong")
    junk = socket.create_connection((host, int(port)), timeout=5)
    junk.sendall(os.urandom(256))
    t1 = threading.Thread(target=make, args=(1,))
    t1.start()
    t0.join(20)
    t1.join(20)
    assert all(groups)
    ts = [torch.arange(5.0) * (r + 1) for r in range(2)]
    works = [threading.Thread(target=groups[r].all_reduce, args=(ts[r],)) for r in range(2)]
    [w.start() for w in works]
    [w.join(20) for w in works]
    assert all(torch.equal(t, torch.arange(5.0) * 3) for t in ts)
    for g in groups:
        g.shutdown()


def test_p2p_survives_an_unexpected_error_and_checks_tags_first(monkeypatch):
    """An error inside a p2p thread reaches the caller's Work (it once killed the thread, leaving that Work and every
    later send to the peer pending forever); a tag c10d could not carry is refused before anything is queued."""
    from pt_dist._infra import p2p

    groups = util.two_tcp_groups("p2p")
    with pytest.raises(ValueError, match="tag must be an int"):
        groups[0].send(torch.ones(2), 1, tag=2**63)
    real, calls = p2p.byte_view, []

    def flaky(t):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("planted failure")
        return real(t)

    monkeypatch.setattr(p2p, "byte_view", flaky)
    with pytest.raises(RuntimeError, match="planted failure"):
        groups[0].send(torch.ones(2), 1).wait(timeout=10)
    got = torch.zeros(2)
    work = groups[1].recv(got, 0, tag=7)
    groups[0].send(torch.full((2,), 5.0), 1, tag=7).wait(timeout=10)  # the same send thread, still serving
    work.wait(timeout=10)
    assert got.tolist() == [5.0, 5.0]
    # the same on the receiving side: that receive fails, its bytes are drained, the reader serves the next one
    doomed = torch.zeros(2)
    monkeypatch.setattr(p2p, "byte_view", lambda t: (_ for _ in ()).throw(RuntimeError("planted"))
                        if t.data_ptr() == doomed.data_ptr()
                        else real(t))
    work = groups[1].recv(doomed, 0, tag=8)
    groups[0].send(torch.full((2,), 6.0), 1, tag=8).wait(timeout=10)
    with pytest.raises(RuntimeError, match="planted"):
        work.wait(timeout=10)
    work = groups[1].recv(got, 0, tag=8)
    groups[0].send(torch.full((2,), 7.0), 1, tag=8).wait(timeout=10)
    work.wait(timeout=10)
    assert got.tolist() == [7.0, 7.0]
    for g in groups:
        g.shutdown()


def test_an_unexpected_error_mid_collective_aborts_the_group_so_peers_fail_fast():
    """Any error inside a collective (here a planted RuntimeError, as torch raising half-way would be) leaves the
    peers mid-transfer: the failing rank aborts the group, so the peer raises at once instead of waiting out the
    timeout, and the failing rank refuses further collectives instead of running them out of step."""
    groups = util.two_tcp_groups("mid", timeout=20.0)

    def planted(t, op):
        raise RuntimeError("planted failure inside the ring")

    groups[0]._all_reduce = planted
    seen = {}

    def run(rank):
        t0 = time.monotonic()
        try:
            groups[rank].all_reduce(torch.ones(1 << 20))
        except Exception as e:  # noqa: BLE001
            seen[rank] = (type(e).__name__, time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads], [t.join(30) for t in threads]
    assert seen[0][0] == "RuntimeError"
    assert seen[1][0] == "DistBackendError" and seen[1][1] < 5, seen  # not the 20 s timeout
    with pytest.raises(DistError, match="unusable"):
        groups[0].all_reduce(torch.ones(4))
    for g in groups:
        g.shutdown()


def test_a_p2p_channel_cut_mid_message_refuses_what_follows():
    """A send that times out half-way leaves part of a message in the stream: later sends on that channel must fail
    (they once went out after the fragment, and the receiver would read them as its tail)."""
    groups = util.two_tcp_groups("cut", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(DistError, match="timed out|failed"):
        groups[0].send(torch.ones(16 << 20), 1).wait(timeout=20)  # 64 MiB, and rank 1 never receives
    assert time.monotonic() - t0 < 10
    with pytest.raises(DistError, match="unusable after an earlier failure"):
        groups[0].send(torch.ones(2), 1).wait(timeout=5)
    for g in groups:
        g.shutdown()


def _barrier_timeout(rank, world_size, backend):
    util.join(rank, world_size, backend, timeout=60, key=f"barrier-timeout-{backend}")
    took = None
    if rank == 1:
        harness.store().get(f"barrier-timeout-{backend}")  # late until rank 0 has given up
    else:
        t0 = time.monotonic()
        with pytest.raises(DistError, match=r"missing ranks \[1\]|timed out|Timed out"):
            pt_dist.barrier(timeout=datetime.timedelta(seconds=1))  # its own deadline, not the group's 60 s
        took = time.monotonic() - t0
        harness.store().set(f"barrier-timeout-{backend}", "1")
    pt_dist.destroy_process_group()
    return took


@pytest.mark.parametrize("backend", [*BACKENDS, "gloo"])
def test_barrier_with_its_own_timeout(backend):
    took = run_ranks(_barrier_timeout, 2, backend, backend=None, timeout=90)[0]
    assert took < 10, took



def test_receives_pending_at_shutdown_or_cut_mid_message_fail_instead_of_hanging(monkeypatch):
    """A receive still posted when its group is destroyed, and one whose message stops half-way, once waited
    forever: the first was dropped with the reader, the second taken off the posted list before it failed."""
    from pt_dist._infra import p2p

    cut_pair, idle_pair = util.two_tcp_groups("cut-mid"), util.two_tcp_groups("idle")
    waiting = idle_pair[1].recv(torch.zeros(4), 0, tag=5)  # nothing will ever be sent
    real = p2p.wire.recv_into_exact

    def cut(sock, view, deadline=None):
        if len(view) == 16:  # the 4-float payload, after its header arrived whole
            raise ConnectionResetError("planted: the sender vanished mid-message")
        return real(sock, view, deadline)

    monkeypatch.setattr(p2p.wire, "recv_into_exact", cut)
    streaming = cut_pair[1].recv(torch.zeros(4), 0, tag=6)
    cut_pair[0].send(torch.ones(4), 1, tag=6).wait(timeout=10)
    with pytest.raises(DistError, match="failed mid-message"):
        streaming.wait(timeout=10)
    monkeypatch.setattr(p2p.wire, "recv_into_exact", real)
    idle_pair[1].shutdown()  # the receiving side first: its peer closing first would break the stream instead
    with pytest.raises(DistError, match="shut down"):
        waiting.wait(timeout=10)
    for g in (*cut_pair, idle_pair[0]):
        g.shutdown()


def test_a_receive_from_any_rank_fails_when_every_peer_is_gone():
    """Posted before the only peer goes, or after (a retry): no reader is left to serve it or to time it out, so
    it fails at once; the retry used to be queued where nothing would ever look at it, and waited forever."""
    groups = util.two_tcp_groups("anygone")
    work = groups[1].recv(torch.zeros(2), None, tag=1)
    groups[0].shutdown()
    with pytest.raises(DistError, match="stream broke"):
        work.wait(timeout=5)
    t0 = time.monotonic()
    with pytest.raises(DistError, match=r"any-source receive, but the channel with every peer is unusable"):
        groups[1].recv(torch.zeros(2), None, tag=1).wait(timeout=5)
    assert time.monotonic() - t0 < 1
    groups[1].shutdown()


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_ranks_started_with_different_world_sizes_fail_at_once(backend):
    """A launch mistake (rank 0 told world_size=2, rank 1 told 3): both say so within a moment; rank 0 used to wait
    out the timeout for a peer that had given up, and rank 1 on shm failed inside mmap."""
    from pt_dist.backends.shm import ProcessGroupSHM

    make = ProcessGroupTCP if backend == "tcp" else ProcessGroupSHM
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10, secret=b"s")
    seen = {}

    def rank(r):
        t0 = time.monotonic()
        try:
            make(PrefixStore("ws", TCPStore("127.0.0.1", master.port, timeout=10, secret=b"s")), r, 2 + r, 20.0,
                 "ws", b"mesh").shutdown()
        except DistError as e:
            seen[r] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in threads], [t.join(30) for t in threads]
    master.close()
    assert all(r in seen and seen[r][1] < 5 for r in range(2)), seen  # the timeout is 20 s
    assert "different world sizes" in seen[1][0] and "different world sizes" in seen[0][0], seen
