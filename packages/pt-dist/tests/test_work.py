"""Work handles and the per-group op queue: order, inline fast path, errors through wait() and futures."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from pt_dist import DistError
from pt_dist.work import OpQueue, Work


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
