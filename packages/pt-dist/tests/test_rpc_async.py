"""``@rpc.functions.async_execution``: the callee answers when the returned Future completes.

Ported from torch/testing/_internal/distributed/rpc/rpc_test.py (``RpcTest``: test_async_function_simple,
test_async_function_chained, test_async_function_nested, test_async_function_raise,
test_async_function_wrong_return_type, test_async_class_method / test_async_static_method, test_async_class_rref_proxy,
test_async_function_remote) and a check torch has no test for: a callee with one pool thread answers eight
slow async calls together, so none of them held a thread while it waited.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pt_dist.rpc as rpc
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402


@rpc.functions.async_execution
def async_add(to, x, y):
    return rpc.rpc_async(to, torch.add, args=(x, y))


@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_add_nested(to, x, y, z):
    return rpc.rpc_async(to, async_add, args=(to, x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_raise_func():
    raise RuntimeError("Expected error")


@rpc.functions.async_execution
def async_wrong_type():
    return torch.zeros(2, 2)


@rpc.functions.async_execution
def async_later(seconds, value):
    """A Future a timer completes: no thread of the callee's pool waits for it."""
    fut = torch.futures.Future()
    threading.Timer(seconds, lambda: fut.set_result(value)).start()
    return fut


class AsyncExecutionClass:
    @staticmethod
    @rpc.functions.async_execution
    def static_async_add(to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    @rpc.functions.async_execution
    def bound_async_add(self, to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


def _async(rank, world_size):
    store = util.start(rank, world_size, num_worker_threads=1)
    try:
        if rank != 0:
            return None
        x, out = torch.ones(2), {}
        out["simple"] = rpc.rpc_sync("worker1", async_add, args=("worker2", x, x))
        out["chained"] = rpc.rpc_sync("worker1", async_add_chained, args=("worker2", x, x, 1))
        out["nested"] = rpc.rpc_async("worker1", async_add_nested, args=("worker2", x, x, 2)).wait()
        out["static"] = rpc.rpc_sync("worker1", AsyncExecutionClass.static_async_add, args=("worker2", x, x, 3))
        obj = rpc.remote("worker1", AsyncExecutionClass)
        out["proxy"] = obj.rpc_sync().bound_async_add("worker2", x, x, 4)
        out["remote"] = rpc.remote("worker1", async_add_chained, args=("worker2", x, x, 5)).to_here()
        try:
            rpc.rpc_sync("worker1", async_raise_func)
        except RuntimeError as e:
            out["raise"] = str(e)
        try:
            rpc.rpc_sync("worker1", async_wrong_type)
        except RuntimeError as e:  # torch's type and words (issue 37, defect 8)
            out["wrong_type"] = str(e)
        t0 = time.monotonic()
        futs = [rpc.rpc_async("worker1", async_later, args=(0.5, i)) for i in range(8)]
        out["later"] = [f.wait() for f in futs]
        out["later_elapsed"] = time.monotonic() - t0
        return out
    finally:
        util.stop(store)


def test_async_execution_answers_when_the_future_completes():
    out = run_ranks(_async, 3, backend=None, timeout=60)[0]
    for key, extra in (("simple", 0), ("chained", 1), ("nested", 2), ("static", 3), ("proxy", 4), ("remote", 5)):
        assert torch.equal(out[key], torch.full((2,), 2.0 + extra)), key
    assert "Expected error" in out["raise"] and "async_raise_func" in out["raise"]
    assert "must return a torch.futures.Future object, but got <class 'torch.Tensor'>" in out["wrong_type"]
    assert out["later"] == list(range(8))
    # 8 calls of 0.5 s on one pool thread: 4 s if each held it, ~0.5 s as none does
    assert out["later_elapsed"] < 2.5, out["later_elapsed"]
