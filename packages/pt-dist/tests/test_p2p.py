"""Point-to-point on tcp, shm and torch's own gloo: batch_isend_irecv (what pipeline engines post each step),
receives matched by tag, and receives from any rank."""

from __future__ import annotations

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


def _batch(rank, world_size, backend):
    util.join(rank, world_size, backend, key=f"batch-{backend}")
    ws, me = world_size, rank
    right, left = (me + 1) % ws, (me - 1) % ws
    n = 1 << 20  # 4 MiB per message: far more than a socket buffer, so a send blocks until the peer reads
    out = {}
    # a ring shift, the receive listed first on even ranks and second on odd ones
    a, b = torch.full((n,), float(me)), torch.empty(n)
    # (one op on no group, one on group.WORLD and named by group_peer: the same group, as torch takes them)
    ops = [pt_dist.P2POp(pt_dist.isend, a, right),
           pt_dist.P2POp(pt_dist.irecv, b, group=pt_dist.group.WORLD, group_peer=left)]
    assert ops[1].peer == left  # a group_peer is also told as its global rank
    for w in pt_dist.batch_isend_irecv(ops if me % 2 else ops[::-1]):
        w.wait()
    out["ring"] = (b[0].item(), b[-1].item(), bool((b == left).all()))
    # pipeline stages: each neighbour pair sends both ways at once (activations forward, gradients back),
    # two messages to the same peer in a row, received in the same order
    ops, got = [], {}
    for peer in (me - 1, me + 1):
        if 0 <= peer < ws:
            got[peer] = [torch.empty(n), torch.empty(3, 5).t()]  # the second receive is non-contiguous
            ops += [pt_dist.P2POp(pt_dist.isend, torch.full((n,), me * 10.0 + peer), peer),
                    pt_dist.P2POp(pt_dist.isend, torch.arange(15.0).view(5, 3) + me, peer),
                    pt_dist.P2POp(pt_dist.irecv, got[peer][0], peer),
                    pt_dist.P2POp(pt_dist.irecv, got[peer][1], peer)]
    for w in pt_dist.batch_isend_irecv(ops):
        w.wait()
    out["pipeline"] = {peer: (bool((x == peer * 10.0 + me).all()), torch.equal(y, torch.arange(15.0).view(5, 3) + peer))
                       for peer, (x, y) in got.items()}
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_batch_isend_irecv(backend):
    ws = 3
    for rank, res in enumerate(run_ranks(_batch, ws, backend, backend=None, timeout=120)):
        left = (rank - 1) % ws
        assert res["ring"] == (left, left, True)
        assert res["pipeline"] == {p: (True, True) for p in (rank - 1, rank + 1) if 0 <= p < ws}


def _tags(rank, world_size, backend):
    """Receives match messages by tag, as gloo's and MPI's do, not by the order they were posted in."""
    util.join(rank, world_size, backend, timeout=3, key=f"tags-{backend}")
    big = 1 << 18  # 1 MiB: more than the socket buffers hold
    out = {}
    if rank == 0:
        for tag, n in ((1, 3), (2, big), (3, 5)):
            pt_dist.send(torch.full((n,), float(tag)), 1, tag=tag)
        for v in (10.0, 20.0):  # one tag twice: received in the order sent
            pt_dist.send(torch.full((2,), v), 1, tag=5)
        pt_dist.send(torch.ones(1), 1, tag=6)
        pt_dist.recv(torch.zeros(1), 1, tag=7)  # rank 1 answers once tag 6 has arrived ...
        pt_dist.send(torch.full((4,), 8.0), 1, tag=8)  # ... and only then is tag 8 sent
        if backend != "gloo":
            pt_dist.send(torch.ones(10), 1, tag=9)
            pt_dist.send(torch.full((3,), 4.0), 1, tag=4)
        harness.store().get(f"tags-{backend}-done")  # rank 1 spends the group timeout on purpose: wait it out
    else:
        got = {tag: torch.zeros(n) for tag, n in ((3, 5), (2, big), (1, 3))}
        works = {tag: pt_dist.irecv(t, 0, tag=tag) for tag, t in got.items()}  # posted in reverse order
        for w in works.values():
            w.wait()
        out["reversed"] = {tag: t.unique().tolist() for tag, t in got.items()}
        first, second = torch.zeros(2), torch.zeros(2)
        w1, w2 = pt_dist.irecv(first, 0, tag=5), pt_dist.irecv(second, 0, tag=5)
        w2.wait(), w1.wait()
        out["one tag"] = (first[0].item(), second[0].item())
        late = torch.zeros(4)
        w8 = pt_dist.irecv(late, 0, tag=8)  # posted first, its message comes only after tag 6's reply
        pt_dist.recv(torch.zeros(1), 0, tag=6)
        pt_dist.send(torch.ones(1), 0, tag=7)
        w8.wait()
        out["causal"] = late[0].item()
        if backend != "gloo":
            t0 = time.monotonic()
            with pytest.raises(DistError, match="nothing arrived from rank 0 with tag=11 within 3.0s"):
                pt_dist.irecv(torch.zeros(1), 0, tag=11).wait()
            out["timed out after"] = round(time.monotonic() - t0)
            with pytest.raises(DistError, match="rank 0 sent tag=9 torch.float32 x 40 bytes, this receive expects"):
                pt_dist.recv(torch.zeros(5), 0, tag=9)
            t = torch.zeros(3)
            pt_dist.recv(t, 0, tag=4)  # the channel is still in step after both
            out["after"] = t.tolist()
        harness.store().set(f"tags-{backend}-done", "1")
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_receives_match_by_tag(backend):
    """The native backends once took messages in arrival order: a receive posted for another tag than the next
    message raised, and one waiting for a message sent only later (tag 8 here) blocked the others behind it."""
    res = run_ranks(_tags, 2, backend, backend=None, timeout=120)[1]
    assert res["reversed"] == {3: [3.0], 2: [2.0], 1: [1.0]} and res["one tag"] == (10.0, 20.0)
    assert res["causal"] == 8.0
    if backend != "gloo":
        assert res["timed out after"] in (3, 4) and res["after"] == [4.0] * 3, res


def _any_source(rank, world_size, backend):
    """recv without src takes the first message of its tag from any rank and reports who sent it."""
    util.join(rank, world_size, backend, key=f"anysrc-{backend}")
    out = {}
    if rank == 0:
        got = torch.zeros(3)
        out["senders"] = sorted(pt_dist.recv(got, tag=3) + 10 * got[0].item() for _ in range(2))
        a, b = torch.zeros(2), torch.zeros(2)
        wa, wb = pt_dist.irecv(a, src=2, tag=4), pt_dist.irecv(b, tag=4)  # rank 2's goes to a, whatever comes first
        wa.wait(), wb.wait()
        out["mixed"] = (a[0].item(), b[0].item(), wb._source_rank())
    else:
        pt_dist.send(torch.full((3,), float(rank)), 0, tag=3)
        pt_dist.send(torch.full((2,), float(rank)), 0, tag=4)
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_recv_from_any_source(backend):
    res = run_ranks(_any_source, 3, backend, backend=None, timeout=120)[0]
    assert res == {"senders": [11.0, 22.0], "mixed": (2.0, 1.0, 1)}, res


def _p2p_in_callbacks(rank, world_size, backend):
    """Callbacks of p2p futures (an extension: gloo's p2p Works have none, NCCL's do) that send or receive on the
    same channel: they ran on the channel's own thread, so a blocking receive from the same peer waited for that
    thread to read, forever, past the group timeout."""
    util.join(rank, world_size, backend, key=f"p2pcb-{backend}", timeout=5)
    out = {}
    if rank == 0:
        time.sleep(0.3)  # so rank 1's callbacks are attached before its first message arrives
        pt_dist.send(torch.ones(4), 1, tag=1)
        pt_dist.send(torch.full((4,), 2.0), 1, tag=2)
        pt_dist.send(torch.full((4,), 3.0), 1, tag=3)
        pt_dist.send(torch.full((4,), 4.0), 1, tag=4)
        back = torch.zeros(4)
        pt_dist.recv(back, 1, tag=5)
        pt_dist.recv(back, 1, tag=6)
        out["back"] = back.tolist()
        harness.store().get(f"p2pcb-{backend}-attached")  # (sent after rank 1's callback is attached)
        pt_dist.send(torch.ones(4), 1, tag=7)
        pt_dist.recv(back, 1, tag=8)
    else:
        later = pt_dist.irecv(torch.zeros(4), 0, tag=4)  # posted before the callback waits on its future

        def receive_more(fut):
            more = torch.zeros(4)
            pt_dist.recv(more, 0, tag=2)  # blocking, same peer
            third = torch.zeros(4)
            pt_dist.irecv(third, 0, tag=3).wait()
            return fut.value()[0][0].item() + more[0].item() + third[0].item() + later.get_future().wait()[0][0].item()

        got = pt_dist.irecv(torch.zeros(4), 0, tag=1).get_future().then(receive_more)
        out["sum"] = got.wait()
        sent = pt_dist.isend(torch.full((4,), 5.0), 0, tag=5).get_future()
        out["chained send"] = sent.then(lambda f: pt_dist.send(torch.full((4,), 6.0), 0, tag=6)).wait() is None
        # a callback that blocks (on a lock this thread holds) holds up no other transfer: callbacks once ran in
        # turn on one completion thread, so the blocking send below waited behind it forever
        lock = threading.Lock()
        with lock:
            held = pt_dist.irecv(torch.zeros(4), 0, tag=7).get_future()
            held = held.then(lambda f: lock.acquire() and lock.release())
            harness.store().set(f"p2pcb-{backend}-attached", "1")
            time.sleep(0.5)  # the message is in, the callback waits for the lock
            pt_dist.send(torch.full((4,), 8.0), 0, tag=8)
        held.wait()
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_p2p_callbacks_may_send_and_receive_on_their_own_channel(backend):
    res = run_ranks(_p2p_in_callbacks, 2, backend, backend=None, timeout=60)
    assert res == [{"back": [6.0] * 4}, {"sum": 10.0, "chained send": True}], res
