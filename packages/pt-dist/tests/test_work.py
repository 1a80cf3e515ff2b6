"""Work handles and the per-group op queue: order, inline fast path, errors through wait() and futures."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError
from pt_dist.work import OpQueue, Work

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _recorder(order: list, gate: threading.Event):
    """``op(i, block)``: an op body that appends ``i`` to ``order`` (after ``gate`` opens, if ``block``)."""
    def op(i, block=False):
        def run():
            if block:
                gate.wait(5)
            order.append(i)
            return [torch.tensor(i)]
        return run
    return op


def test_async_ops_run_in_submission_order_and_sync_ops_wait_behind_them():
    q, order, gate = OpQueue("t"), [], threading.Event()
    op = _recorder(order, gate)

    works = [q.submit("a", op(0, block=True), async_op=True), q.submit("b", op(1), async_op=True)]
    assert not works[0].is_completed()  # the caller is free while the first op is stuck
    threading.Timer(0.2, gate.set).start()
    sync = q.submit("c", op(2), async_op=False)  # queued behind the async ones, not inline
    assert sync.is_completed() and order == [0, 1, 2]
    assert [w.result()[0].item() for w in works] == [0, 1]
    assert q.submit("d", op(3), async_op=False).is_completed() and order[-1] == 3  # idle queue: inline
    q.shutdown()


def test_threads_submitting_first_async_ops_at_once_start_one_worker():
    """Each first async op started the worker thread outside the queue's lock, so threads racing to submit could
    start several workers on one queue: the extra ones outlived ``shutdown`` and, taking consecutive items,
    ran ops one thread had submitted in order out of order (a collective order differing across ranks)."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so a window in submit shows
    try:
        for trial in range(30):
            q = OpQueue(f"race{trial}")
            start = threading.Barrier(4)

            def submit(q=q, start=start):
                start.wait()
                q.submit("op", lambda: None, async_op=True).wait(timeout=10)

            threads = [threading.Thread(target=submit) for _ in range(4)]
            [t.start() for t in threads]
            [t.join(10) for t in threads]
            workers = [t for t in threading.enumerate() if t.name == f"pt_dist-race{trial}"]
            assert len(workers) == 1, f"trial {trial}: {len(workers)} workers for one queue"
            ran = []
            works = [q.submit("op", (lambda i=i, ran=ran: ran.append(i)), async_op=True) for i in range(500)]
            works[-1].wait(timeout=10)
            assert ran == list(range(500))
            q.shutdown()
            assert not workers[0].is_alive()
    finally:
        sys.setswitchinterval(interval)


def test_a_blocking_call_from_a_callback_runs_right_after_its_op():
    """A ``then`` callback runs on the queue's thread; a blocking collective in it once waited on that very
    thread forever. Now it runs inline, before ops queued later (the same order on every rank)."""
    q, order, gate = OpQueue("t"), [], threading.Event()
    op = _recorder(order, gate)

    first = q.submit("a", op(0, block=True), async_op=True)
    chained = first.get_future().then(lambda f: q.submit("hook", op(1), async_op=False).result()[0].item())
    later = q.submit("b", op(2), async_op=True)  # queued before the first op finishes
    gate.set()
    later.wait(timeout=10)  # raises instead of hanging the suite if the hook deadlocks the queue
    assert chained.wait() == 1 and later.result()[0].item() == 2
    assert order == [0, 1, 2]
    q.shutdown()


def test_an_async_call_from_a_callback_runs_inline_so_its_future_can_be_waited_on():
    """PowerSGD's hook issues async all-reduces inside ``then`` callbacks and waits on their futures; queued
    behind the op whose callback was running, they waited on the queue's own thread forever (past any timeout)."""
    q, order, gate = OpQueue("t"), [], threading.Event()
    op = _recorder(order, gate)

    def hook(f):
        p = q.submit("p", op(1), async_op=True).get_future().wait()[0].item()
        return q.submit("q", op(2), async_op=True).get_future().then(lambda g: p + g.value()[0].item())

    first = q.submit("a", op(0, block=True), async_op=True)
    chained = first.get_future().then(hook)
    later = q.submit("b", op(3), async_op=True)  # queued before the first op finishes
    gate.set()
    later.wait(timeout=10)
    assert chained.wait().wait() == 3 and order == [0, 1, 2, 3]  # right after their op, as blocking calls run

    # a wait from that thread on an op queued behind the running one (Work.wait, or its future's wait as PowerSGD
    # writes it) waited on the thread that must run it, forever: it now runs the queue up to that op first
    for how in ("work", "future"):
        gate.clear()
        del order[:]
        first = q.submit("a", op(4, block=True), async_op=True)
        queued = {}

        def wait_on_b(f, how=how, queued=queued):
            return queued["b"].wait() if how == "work" else queued["b"].get_future().wait()[0].item()

        stuck = first.get_future().then(wait_on_b)
        queued["b"] = q.submit("b", op(5), async_op=True)
        queued["c"] = q.submit("c", op(6), async_op=True)
        gate.set()
        assert queued["c"].wait(timeout=10) and stuck.wait() == (True if how == "work" else 5)
        assert order == [4, 5, 6], how
    # its own Work, from a callback of its future (which runs before the Work completes): its outcome, not a hang
    gate.clear()
    own = q.submit("own", op(8, block=True), async_op=True)
    chained = own.get_future().then(lambda f: (own.wait(), own.result()[0].item(), f.wait()[0].item()))
    gate.set()
    assert chained.wait() == (True, 8, 8)
    # such a wait's timeout holds: no queued op is started past it (the rest run later, in order, as usual)
    gate.clear()
    del order[:]
    first = q.submit("a", op(9, block=True), async_op=True)
    queued = {}

    def wait_briefly(f, queued=queued):
        try:
            return queued["b"].wait(timeout=0.1)
        except DistError as e:
            return str(e)

    brief = first.get_future().then(wait_briefly)
    queued["slow"] = q.submit("slow", lambda: time.sleep(0.5), async_op=True)
    queued["b"] = q.submit("b", op(10), async_op=True)
    gate.set()
    assert "timed out" in brief.wait() and queued["b"].wait(timeout=10) and order == [9, 10]
    # a callback may shut its own queue down (destroy_process_group in a hook): it cannot join its own thread
    shut = q.submit("a", op(7), async_op=True).get_future().then(lambda f: q.shutdown())
    shut.wait()
    q.shutdown()


def _powersgd_like_hook(rank, world_size, backend):
    """A comm hook chained as PowerSGD's: all-reduce the bucket, then in its callback all-reduce P and wait on
    that future, then all-reduce Q and return that future; ``async_op`` collectives throughout."""
    util.join(rank, world_size, backend, timeout=20)
    try:
        threads = []

        def compress(fut):
            threads.append(threading.current_thread().name)
            p = fut.value()[0] * 1.0
            pt_dist.all_reduce(p, async_op=True).get_future().wait()
            return pt_dist.all_reduce(p * 2, async_op=True).get_future().then(lambda f: f.value()[0])

        if rank == 0:
            time.sleep(0.3)  # so rank 1's callback is attached before its all-reduce ends: it runs on the worker
        grad = torch.full((64,), float(rank + 1))
        out = pt_dist.all_reduce(grad, async_op=True).get_future().then(compress).wait().wait()
        after = torch.ones(4)
        pt_dist.all_reduce(after)  # the group goes on
        # a callback waiting on a list-form op queued behind its own (its Work wraps the packed collective's)
        if rank == 0:
            time.sleep(0.3)
        first = pt_dist.all_reduce(torch.ones(1 << 16), async_op=True)
        outs = [torch.zeros(2) for _ in range(world_size)]
        listed = pt_dist.all_to_all(outs, [torch.full((2,), float(rank)) for _ in range(world_size)], async_op=True)
        peer = first.get_future().then(lambda f: (listed.wait(), outs[1 - rank][0].item())[1]).wait()
        return out[0].item(), after[0].item(), threads, peer
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_a_comm_hook_chaining_async_collectives_in_callbacks_completes(backend):
    results = run_ranks(_powersgd_like_hook, 2, backend, backend=None, timeout=60)
    assert [r[:2] for r in results] == [(24.0, 2.0)] * 2  # (1 + 2) -> P: 3 * 2 = 6 -> Q: 6 * 2 * 2 = 24
    assert [r[3] for r in results] == [1.0, 0.0]
    if backend != "gloo":
        assert results[1][2][0].startswith("pt_dist-"), results[1][2]  # the worker path was taken


def _a_callback_waits_on_a_later_ops_chained_future(rank, world_size, backend):
    """A hook as torch's are written: two async all-reduces, the second chained with ``then``; the first's callback
    waits on that chained future. The second op sits on the group's queue behind the thread running the callback."""
    util.join(rank, world_size, backend, timeout=20)
    try:
        if rank == 0:
            time.sleep(0.3)  # so rank 1's callback is attached before its first all-reduce ends: it runs on the worker
        a, b = torch.full((256,), float(rank + 1)), torch.full((4,), float(rank + 1))
        threads = []
        fut_a = pt_dist.all_reduce(a, async_op=True).get_future()
        fut_b = pt_dist.all_reduce(b, async_op=True).get_future().then(lambda f: f.value()[0] * 10)

        def both(f):
            threads.append(threading.current_thread().name)
            return f.value()[0][0].item() + fut_b.wait()[0].item()
        out = fut_a.then(both).wait()
        chained = fut_b.then(lambda f: f.value()[1].item()).then(lambda f: f.value() + 1).wait()  # chains of chains
        return out, chained, threads
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_a_callback_waiting_on_a_then_chained_future_of_a_later_op_completes(backend):
    """The first op's callback ran on the group's only thread and waited on the second op's chained future, which
    could not help the op along (a plain torch future): the second op, queued behind, never ran, on any rank."""
    results = run_ranks(_a_callback_waits_on_a_later_ops_chained_future, 2, backend, backend=None, timeout=60)
    assert [r[:2] for r in results] == [(3.0 + 30.0, 31.0)] * 2
    if backend != "gloo":
        assert results[1][2][0].startswith("pt_dist-"), results[1][2]  # rank 1's callback ran on the worker


def _a_callback_waits_through_add_done_callback(rank, world_size, backend):
    """Issue 34, defect 2: the first op's callback attaches to the second op's ``then``-chained future with
    ``add_done_callback`` and waits on an Event that callback sets (a wait the future cannot see)."""
    util.join(rank, world_size, backend, timeout=20)
    try:
        if rank == 0:
            time.sleep(0.3)  # so rank 1's callback is attached before its first all-reduce ends: it runs on the worker
        a, b = torch.full((256,), float(rank + 1)), torch.full((4,), float(rank + 1))
        fut_a = pt_dist.all_reduce(a, async_op=True).get_future()
        fut_b = pt_dist.all_reduce(b, async_op=True).get_future().then(lambda f: f.value()[0] * 10)

        def both(f):
            seen, box = threading.Event(), []
            fut_b.add_done_callback(lambda g: (box.append(g.value()[0].item()), seen.set()))
            return seen.wait(10), f.value()[0][0].item(), box[:1], threading.current_thread().name
        return fut_a.then(both).wait()
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_a_callback_waiting_on_a_later_ops_future_through_add_done_callback_completes(backend):
    """On torch's gloo the second op completes on its other thread and runs its chained callbacks there; on tcp and
    shm the callback sat on the group's only thread, the second op queued behind it, and the wait ran out."""
    results = run_ranks(_a_callback_waits_through_add_done_callback, 2, backend, backend=None, timeout=60)
    assert [r[:3] for r in results] == [(True, 3.0, [30.0])] * 2
    if backend != "gloo":
        assert results[1][3].startswith("pt_dist-"), results[1][3]  # rank 1's callback ran on the worker


def test_errors_surface_through_wait_and_the_future():
    q = OpQueue("t")

    def boom():
        raise DistError("all_reduce on group 'g': peer gone")

    w = q.submit("all_reduce", boom, async_op=True)
    with pytest.raises(DistError, match="peer gone"):
        w.wait()
    assert w.is_completed() and not w.is_success()
    with pytest.raises(Exception, match="peer gone"):
        w.get_future().wait()
    with pytest.raises(DistError, match="peer gone"):
        q.submit("all_reduce", boom, async_op=False)
    q.shutdown()


def test_future_then_chains_and_wait_timeout():
    done = Work.completed("x", [torch.ones(2)])
    assert done.get_future().then(lambda f: f.value()[0].sum().item()).wait() == 2.0
    pending = Work("slow")
    t0 = time.monotonic()
    with pytest.raises(DistError, match="timed out"):
        pending.wait(timeout=0.1)
    assert time.monotonic() - t0 < 2
    import datetime

    threading.Timer(0.2, pending._finish, args=([1],)).start()
    assert pending.wait(timeout=datetime.timedelta(0))  # torch's default: no timeout (it raised at once)


class _LaunchedOnAStream:
    """A torch Work as NCCL's behaves on a GPU: its future is complete at launch, ``wait()`` only orders the
    caller's current stream after the kernel (counted here), ``is_completed()`` says whether the GPU is done."""

    def __init__(self):
        self.waits, self.kernel_done = 0, False
        self.fut = torch.futures.Future()
        self.fut.set_result([torch.zeros(1)])

    def wait(self, timeout=None):
        self.waits += 1
        return True

    def is_completed(self):
        return self.kernel_done

    def get_future(self):
        return self.fut


def test_adapter_works_order_the_callers_stream_on_every_wait_as_torchs():
    """The adapter's list-form async collectives (all_to_all, the coalesced ones) never called torch's wait():
    on a GPU the caller's stream was not ordered after the kernel; later waits returned without ordering theirs."""
    from pt_dist._compat.list_collectives import _ThenWork
    from pt_dist._compat.torch_work import TorchWork

    nccl, unpacked = _LaunchedOnAStream(), []
    listed = _ThenWork("all_to_all", TorchWork("all_to_all_single", "g", nccl, [torch.zeros(1)], streams=True),
                       lambda: unpacked.append(1), ["outs"])
    assert unpacked == [1] and not listed.is_completed()  # the GPU is not done
    listed.wait()
    assert nccl.waits >= 1
    nccl.kernel_done = True
    assert listed.is_completed()

    nccl, posted = _LaunchedOnAStream(), []
    work = TorchWork("all_reduce", "g", nccl, [torch.zeros(1)], post=lambda: posted.append(1), streams=True)
    assert work.get_future() is work.get_future() and posted == [1]  # the post ran in torch's future's callback
    for _ in range(3):
        before = nccl.waits
        work.wait()
        assert nccl.waits > before  # each wait orders the then-current stream, as torch's
    work.synchronize()
    assert posted == [1]
