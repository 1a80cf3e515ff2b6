"""Ctrl-C (KeyboardInterrupt) on the native backends: in the middle of a collective, and while init waits for a
peer; and ``ProcessGroup.abort`` from a watchdog thread. Nothing is left half-done: the group is aborted (peers
fail fast), or what the init had opened (threads, sockets, shared-memory segments) is released."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402

BACKENDS = ["tcp", "shm"]


class CtrlC:
    """Presses Ctrl-C (SIGINT to this process) after ``delay``, and again every 2 s while the interrupted call has
    not returned, as a user does when a press is lost (one landing in a finalizer, ``__del__``, is ignored by
    Python); 2 s leaves the call's own cleanup, after a press that did land, time to finish undisturbed.
    Use as ``with CtrlC(): call()``: the call's KeyboardInterrupt is swallowed, later presses are ignored."""

    AGAIN_AFTER = 2.0

    def __init__(self, delay: float = 0.5):
        self.delay, self.armed, self.interrupted = delay, threading.Event(), False
        self._raised_at = float("-inf")

    def _handler(self, signum, frame):
        if self.armed.is_set():
            self._raised_at = time.monotonic()
            raise KeyboardInterrupt

    def _press(self):
        time.sleep(self.delay)
        while self.armed.is_set():
            if time.monotonic() - self._raised_at >= self.AGAIN_AFTER:
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)

    def __enter__(self):
        self._saved = signal.signal(signal.SIGINT, self._handler)
        self.armed.set()
        self._presser = threading.Thread(target=self._press, daemon=True)
        self._presser.start()
        return self

    def __exit__(self, kind, exc, tb):
        self.armed.clear()
        self._presser.join()
        signal.signal(signal.SIGINT, self._saved)
        self.interrupted = kind is KeyboardInterrupt
        return self.interrupted


def _interrupted(rank, world_size, backend):
    util.join(rank, world_size, backend, timeout=20, key=f"interrupt-{backend}")
    out = {}
    if rank == 0:
        with CtrlC() as ctrl_c:
            pt_dist.all_reduce(torch.ones(1 << 18))  # rank 1 is not there yet: Ctrl-C lands mid-collective
        out["interrupted"] = ctrl_c.interrupted
        try:
            pt_dist.all_reduce(torch.ones(4))
        except DistError as e:
            out["next"] = "unusable" in str(e)
        harness.store().set("interrupted", "1")
    else:
        harness.store().get("interrupted")
        t0 = time.monotonic()
        try:
            pt_dist.all_reduce(torch.ones(1 << 18))
        except DistError:
            out["peer fails fast"] = time.monotonic() - t0 < 5
    pt_dist.destroy_process_group()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_mid_collective_aborts_the_group(backend):
    """KeyboardInterrupt inside a collective (a notebook user stopping a hung cell) aborts the group like any other
    failure: the next collective says the group is unusable instead of running out of step, and peers fail fast."""
    assert run_ranks(_interrupted, 2, backend, backend=None, timeout=90) == [
        {"interrupted": True, "next": True}, {"peer fails fast": True}]


def _interrupted_setup(rank, world_size, backend, path):
    before, segments = set(threading.enumerate()), set(util.open_segments())  # a pooled rank may hold earlier jobs'
    with CtrlC():  # the second rank never comes: Ctrl-C lands while rank 0 waits for it (mesh; shm: segment attach)
        pt_dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=2, timeout=60)
    time.sleep(0.3)
    left = [t.name for t in set(threading.enumerate()) - before]
    left += [s for s in util.open_segments() if s not in segments]
    pt_dist.init_process_group(backend, init_method=f"file://{path}.retry", rank=0, world_size=1, timeout=5)
    t = torch.ones(2)
    pt_dist.all_reduce(t)
    pt_dist.destroy_process_group()
    return left, t.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_during_setup_leaves_no_thread_or_segment_behind(backend, tmp_path):
    """tcp: the half-built mesh closed its listener but left the thread accepting on it blocked until the timeout
    (10 minutes by default), once per interrupted init in a notebook. shm: the segment rank 0 created stayed open
    (its name was removed, its memory held) after a peer never attached, by timeout or Ctrl-C."""
    got = run_ranks(_interrupted_setup, 1, backend, str(tmp_path / "rdzv"), backend=None, timeout=60)
    assert got == [([], [1.0, 1.0])]


def _watchdog(rank, world_size, backend, how):
    util.join(rank, world_size, backend, timeout=30, key=f"{how}-{backend}")
    hs, out = harness.store(), {}
    try:
        if rank == 0:  # the collective waits for rank 1, which is elsewhere; another thread gives up on it
            group = pt_dist.group.WORLD
            threading.Timer(0.5, group.abort if how == "abort" else pt_dist.destroy_process_group).start()
            t0 = time.monotonic()
            with pytest.raises(pt_dist.DistBackendError, match="aborted|shut"):
                pt_dist.all_reduce(torch.ones(1 << 18))
            out["hung_for"] = time.monotonic() - t0
            with pytest.raises(DistError if how == "abort" else ValueError, match="aborted|not initialized"):
                pt_dist.all_reduce(torch.ones(4))
            hs.set(f"{how}-{backend}-done", "1")
        else:
            hs.get(f"{how}-{backend}-done")
            t0 = time.monotonic()
            with pytest.raises(pt_dist.DistBackendError):  # its peer is gone: it fails fast, not at the timeout
                pt_dist.all_reduce(torch.ones(4))
            out["peer_failed_in"] = time.monotonic() - t0
    finally:
        if pt_dist.is_initialized():
            pt_dist.destroy_process_group()
    return out


@pytest.mark.parametrize("how", ["abort", "destroy"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_abort_or_destroy_from_another_thread_ends_a_hung_collective(backend, how):
    """A watchdog calling ``ProcessGroup.abort``, or a SIGTERM handler calling ``destroy_process_group``, while
    the main thread waits in a collective for a rank that is elsewhere."""
    out = run_ranks(_watchdog, 2, backend, how, backend=None, timeout=90)
    assert 0.4 < out[0]["hung_for"] < 5, out  # the group's timeout is 30 s
    assert out[1]["peer_failed_in"] < 5, out


def _destroy_behind_async_work(rank, world_size, backend):
    util.join(rank, world_size, backend, timeout=30, key=f"drain-{backend}")
    ts = [torch.full((4 << 20,), rank + 1.0), torch.full((10,), rank + 1.0), torch.full((10,), rank + 1.0)]
    works = [pt_dist.all_reduce(t, async_op=True) for t in ts]
    pt_dist.destroy_process_group()  # right away, from the thread that issued them
    return [w.wait() and float(t.min()) == float(t.max()) == 3.0 for w, t in zip(works, ts)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_destroy_lets_the_async_work_issued_before_it_finish(backend):
    """shm aborted it: every Work failed and the tensors were left unreduced (tcp and torch's gloo finish it)."""
    assert run_ranks(_destroy_behind_async_work, 2, backend, backend=None, timeout=90) == [[True] * 3] * 2


def test_abort_ends_a_transfer_waiting_for_a_stalled_peer():
    """Past the header exchange, in the ring's data transfer: the peer agreed to the collective, then stalls."""
    groups = util.two_tcp_groups("stalled", timeout=30.0)
    stalled = threading.Event()
    groups[1]._all_reduce = lambda t, op: stalled.wait(30)  # joins the collective, then sends nothing
    seen = {}

    def run(rank):
        t0 = time.monotonic()
        try:
            groups[rank].all_reduce(torch.ones(1 << 20))
        except DistError as e:
            seen[rank] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    time.sleep(0.5)
    groups[0].abort()
    threads[0].join(10)
    stalled.set()
    threads[1].join(10)
    assert "aborted or shut down mid-collective" in seen[0][0] and seen[0][1] < 3, seen
    # the transfer may instead read its own shut-down socket's end first, as if the peer had closed (once in CI)
    said = str(groups[0].mesh._fail("all_reduce", "rank 1 closed its connection (exited or aborted)", [1]))
    assert "the group was aborted or shut down mid-collective (rank 1 closed" in said, said
    for g in groups:
        g.shutdown()


def test_the_mesh_acceptor_ends_quietly_greets_in_parallel_and_refuses_late_connections():
    """The acceptor died on EBADF (an unhandled thread exception on the user's stderr) when a setup that gave
    up closed the listener between its polls; it greeted connections one at a time, so a silent stranger held
    a real peer off for the whole handshake timeout (10 s), and then, bounded, a crowd of them still did (the
    oldest silent one is now cut for each newcomer past the bound); and a connection it took after the setup
    had closed the others stayed open."""
    from pt_dist._infra import wire
    from pt_dist._infra.full_mesh import COLL, P2P, MeshSetup

    mesh = MeshSetup(0, 3, 30.0, "acceptor")  # the acceptor driven by hand
    mesh._expected = 2  # rank 1's two connections complete it; rank 2 then comes late
    listener = wire.listen("127.0.0.1", 0, backlog=4)
    listener.close()
    mesh._accept(listener, b"s")  # raised OSError (EBADF) before

    listener = wire.listen("127.0.0.1", 0, backlog=4)
    port = listener.getsockname()[1]
    acceptor = threading.Thread(target=mesh._accept, args=(listener, b"s"), daemon=True)
    acceptor.start()
    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]  # connect, then say nothing
    other = MeshSetup(1, 3, 5.0, "acceptor")  # dials in as rank 1
    t0 = time.monotonic()
    client = [other._connect(0, "127.0.0.1", port, b"s", chan) for chan in (COLL, P2P)]
    assert mesh._all_in.wait(10) and time.monotonic() - t0 < 4, "the silent strangers held the real peer off"
    greeters = [t for t in threading.enumerate() if t.name == "pt_dist-mesh-greet-acceptor"]
    assert len(greeters) <= 2 * (2 * 3 + 16)
    mesh._accepting = False  # the setup is over (as it sets it); a peer arrives late
    other.rank = 2
    late = other._connect(0, "127.0.0.1", port, b"s", COLL)
    late.settimeout(5)
    assert late.recv(1) == b"", "the late connection must be closed"
    assert sorted(mesh.socks) == [(1, COLL), (1, P2P)]
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    acceptor.join(5)
    assert not acceptor.is_alive()
    for sock in [*strangers, late, *client, *mesh.socks.values()]:
        sock.close()
