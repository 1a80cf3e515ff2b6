"""rpc_sync / rpc_async on 2 and 3 workers: builtins, user functions, tensors, exceptions, timeouts, nesting.

Ported from torch/testing/_internal/distributed/rpc/rpc_test.py (``RpcTest``: test_self_add, test_add,
test_add_with_id, test_scalar_add, test_async_add, test_nonzero, test_multi_rpc, test_py_built_in,
test_py_user_defined, test_py_class_constructor, test_py_class_instance_method, test_py_class_static_method,
test_py_tensors, test_py_nested_pickle, test_py_raise_in_user_func, test_nested_rpc, test_rpc_timeouts,
test_wait_all, test_future_then / collect_all, test_worker_id, test_get_worker_infos) against pt_dist.rpc.
Each ``run_ranks`` call runs one group of checks on worker 0; the others serve until shutdown.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pt_dist
import pt_dist.rpc as rpc
import pytest
import torch
from pt_dist.rpc.rpc_agent import get_current_rpc_agent

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402


def my_function(a, b, c):
    return a + b + c


def my_tensor_function(a, b):
    return a + b


def my_complex_tensor_function(list_input, tensor_class_input, dict_input):
    res = list_input[0]
    for t in list_input:
        res += t
    for v in dict_input.values():
        res += v
    complex_tensors = tensor_class_input.tensors
    return (res, complex_tensors[0], complex_tensors[1], complex_tensors[2])


class TensorClass:
    def __init__(self, tensors):
        self.tensors = tensors


class MyClass:
    def __init__(self, a):
        self.a = a

    def my_instance_method(self, b):
        return self.a + b

    @staticmethod
    def my_static_method(f):
        return f > 10


def raise_func():
    raise ValueError("Expected error")


def raise_func_escape():
    raise ValueError("Expected error\nwith a newline")


def my_sleep_func(seconds=1.0):
    time.sleep(seconds)
    return torch.mul(torch.tensor(1), torch.tensor(1))


def nested_rpc(dst):
    return rpc.rpc_sync(dst, torch.add, args=(torch.ones(2, 2), 1))


def nested_rpc_to_third(third):
    """On worker1: call worker ``third`` (a nested call to a third worker) and add our own id."""
    return rpc.rpc_sync(third, torch.mul, args=(torch.ones(3), 3)) + rpc.get_worker_info().id


def who_am_i():
    return rpc.get_worker_info().name


def _basics(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        n = world_size
        dst = f"worker{1 % n}"
        checks = {}
        checks["self_add"] = rpc.rpc_sync("worker0", torch.add, args=(torch.ones(2, 2), 1))
        checks["add"] = rpc.rpc_sync(dst, torch.add, args=(torch.ones(n, n), torch.ones(n, n)))
        checks["add_with_id"] = rpc.rpc_sync(rpc.get_worker_info(dst), torch.add, args=(torch.ones(2), 1))
        checks["add_by_rank"] = rpc.rpc_sync(1, torch.add, args=(torch.ones(2), 3))
        checks["scalar_add"] = rpc.rpc_sync(dst, torch.add, args=(torch.ones(n, n), n))
        checks["async_add"] = rpc.rpc_async(dst, torch.add, args=(torch.ones(n, n), torch.ones(n, n))).wait()
        x = torch.ones(4, 4)
        x[1][1] = 0
        checks["nonzero"] = rpc.rpc_sync(dst, torch.nonzero, args=(x,))
        checks["multi_rpc"] = [rpc.rpc_sync(dst, torch.add, args=(torch.ones(n, n), torch.ones(n, n) * i))
                               for i in range(10)]
        checks["py_built_in"] = rpc.rpc_sync(dst, min, args=(n, n + 1, n + 2))
        checks["py_user_defined"] = rpc.rpc_sync(dst, my_function, kwargs={"a": n, "b": n + 1, "c": n + 2})
        checks["py_class_constructor"] = rpc.rpc_sync(dst, MyClass, args=(n,)).a
        checks["py_class_instance_method"] = rpc.rpc_sync(dst, MyClass(2).my_instance_method, args=(n,))
        checks["py_class_static_method"] = rpc.rpc_sync(dst, MyClass.my_static_method, args=(n + 10,))
        checks["py_tensors"] = rpc.rpc_sync(dst, my_tensor_function, args=(torch.ones(n, n), torch.ones(n, n)))
        a, b = torch.ones(n, n), torch.ones(n, n)
        checks["py_nested_pickle"] = rpc.rpc_sync(
            dst, my_complex_tensor_function,
            args=([a, b], TensorClass([a, b, torch.ones(3, dtype=torch.bfloat16)]), {"k": a}))
        odd = torch.arange(30, dtype=torch.float64).view(5, 6).t()  # non-contiguous
        checks["noncontiguous"] = rpc.rpc_sync(dst, torch.clone, args=(odd,))
        checks["dtypes"] = [rpc.rpc_sync(dst, torch.clone, args=(torch.arange(5).to(d),))
                            for d in (torch.bool, torch.int8, torch.float16, torch.complex64, torch.int64)]
        checks["empty"] = rpc.rpc_sync(dst, torch.clone, args=(torch.empty(0, 3),))
        big = torch.randn(3 << 20)  # 12 MiB: streamed in the transport's 4 MiB chunks
        checks["big"] = (big, rpc.rpc_sync(dst, torch.clone, args=(big,)))
        conn = get_current_rpc_agent().connections.peers[1]
        checks["cross_memory"] = (conn.read_pid, conn.lend, len(conn._lent))
        futs = [rpc.rpc_async(f"worker{(i % (n - 1)) + 1}", torch.add, args=(torch.ones(2), i)) for i in range(20)]
        checks["wait_all"] = torch.futures.wait_all(futs)
        checks["then"] = rpc.rpc_async(dst, torch.add, args=(torch.ones(2), 1)).then(lambda f: f.wait() * 10).wait()
        checks["collect_all"] = [f.wait() for f in torch.futures.collect_all(
            [rpc.rpc_async(dst, torch.add, args=(torch.ones(1), i)) for i in range(3)]).wait()]
        checks["names"] = [rpc.rpc_sync(f"worker{i}", who_am_i) for i in range(n)]
        checks["nested"] = rpc.rpc_sync(dst, nested_rpc, args=("worker0",))
        if n >= 3:
            checks["nested_third"] = rpc.rpc_sync("worker1", nested_rpc_to_third, args=("worker2",))
        return checks
    finally:
        util.stop(store)


@pytest.mark.parametrize("world_size", [2, 3])
def test_calls_builtins_user_functions_and_tensors(world_size):
    c = run_ranks(_basics, world_size, backend=None, timeout=60)[0]
    n = world_size
    assert torch.equal(c["self_add"], torch.ones(2, 2) + 1)
    assert torch.equal(c["add"], torch.full((n, n), 2.0))
    assert torch.equal(c["add_with_id"], torch.full((2,), 2.0))
    assert torch.equal(c["add_by_rank"], torch.full((2,), 4.0))
    assert torch.equal(c["scalar_add"], torch.full((n, n), 1.0 + n))
    assert torch.equal(c["async_add"], torch.full((n, n), 2.0))
    x = torch.ones(4, 4)
    x[1][1] = 0
    assert torch.equal(c["nonzero"], torch.nonzero(x))
    assert all(torch.equal(r, torch.ones(n, n) * (1 + i)) for i, r in enumerate(c["multi_rpc"]))
    assert c["py_built_in"] == n
    assert c["py_user_defined"] == 3 * n + 3
    assert c["py_class_constructor"] == n
    assert c["py_class_instance_method"] == 2 + n
    assert c["py_class_static_method"] is True
    assert torch.equal(c["py_tensors"], torch.full((n, n), 2.0))
    res, t0, t1, t2 = c["py_nested_pickle"]
    a, b = torch.ones(n, n), torch.ones(n, n)  # the same aliasing as sent: ``a`` three times, one tensor there too
    want = my_complex_tensor_function([a, b], TensorClass([a, b, torch.ones(3, dtype=torch.bfloat16)]), {"k": a})
    assert torch.equal(res, want[0]) and torch.equal(res, torch.full((n, n), 6.0)) and torch.equal(t0, res)
    assert t2.dtype == torch.bfloat16 and torch.equal(t2, torch.ones(3, dtype=torch.bfloat16))
    assert torch.equal(c["noncontiguous"], torch.arange(30, dtype=torch.float64).view(5, 6).t())
    for d, got in zip((torch.bool, torch.int8, torch.float16, torch.complex64, torch.int64), c["dtypes"]):
        assert got.dtype == d and torch.equal(got, torch.arange(5).to(d))
    assert c["empty"].shape == (0, 3)
    sent, back = c["big"]
    assert torch.equal(sent, back)
    read_pid, lend, still_lent = c["cross_memory"]
    assert still_lent == 0 and (read_pid != 0) == lend  # siblings on one host: both ways or neither
    assert all(torch.equal(r, torch.ones(2) + i) for i, r in enumerate(c["wait_all"]))
    assert torch.equal(c["then"], torch.full((2,), 20.0))
    assert [r.item() for r in c["collect_all"]] == [1.0, 2.0, 3.0]
    assert c["names"] == [f"worker{i}" for i in range(n)]
    assert torch.equal(c["nested"], torch.ones(2, 2) + 1)
    if n >= 3:
        assert torch.equal(c["nested_third"], torch.full((3,), 4.0))


def _errors(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {}
        try:
            rpc.rpc_sync("worker1", raise_func)
        except ValueError as e:
            out["raise"] = str(e)
        fut = rpc.rpc_async("worker1", raise_func_escape)
        try:
            fut.wait()
        except ValueError as e:
            out["escape"] = str(e)
        try:
            rpc.rpc_sync("worker1", my_sleep_func, args=(1.0,), timeout=0.3)
        except RuntimeError as e:
            out["timeout"] = str(e)
        t0 = time.monotonic()
        try:
            rpc.rpc_async("worker1", my_sleep_func, args=(1.0,), timeout=0.3).wait()
        except RuntimeError:
            out["timeout_elapsed"] = time.monotonic() - t0
        out["no_timeout"] = rpc.rpc_sync("worker1", my_sleep_func, args=(0.1,), timeout=0).item()
        out["after"] = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1)).item()
        for bad in ("nope", 7):
            try:
                rpc.rpc_sync(bad, torch.add, args=(1, 1))
            except RuntimeError as e:  # torch's type (issue 37, defect 9)
                out[f"bad_{bad}"] = str(e)
        try:
            rpc.rpc_sync("worker1", lambda: 1)
        except Exception as e:  # a lambda cannot be pickled by reference: refused before anything is sent
            out["lambda"] = type(e).__name__
        return out
    finally:
        util.stop(store)


def test_exceptions_carry_the_remote_traceback_and_timeouts_fire():
    out = run_ranks(_errors, 2, backend=None, timeout=60)[0]
    assert "Expected error" in out["raise"]
    assert "On WorkerInfo(id=1, name=worker1)" in out["raise"] and "raise_func" in out["raise"]
    assert "Traceback" in out["raise"]
    assert "with a newline" in out["escape"]
    assert "RPC ran for more than set timeout (300 ms)" in out["timeout"]
    assert out["timeout_elapsed"] < 1.0, out["timeout_elapsed"]  # the answer would come after 1 s
    assert out["no_timeout"] == 1 and out["after"] == 2.0
    assert "could not find destination" in out["bad_nope"] and "nope" in out["bad_nope"]
    assert "Invalid destination worker id 7" in out["bad_7"]
    assert out["lambda"] in ("PicklingError", "AttributeError")


def _init_method(rank, world_size):
    import ptdist_testutil

    import harness

    if rank == 0:
        harness.store().set("rpc_init_port", str(ptdist_testutil.free_port()))
    port = int(harness.store().get("rpc_init_port"))
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=20)
    rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    try:
        me = rpc.get_worker_info()
        peer = rpc.get_worker_info(f"trainer{(rank + 1) % world_size}")
        got = rpc.rpc_sync(peer, torch.mul, args=(torch.ones(2), rank + 1))
        try:
            rpc.init_rpc("again", rank=rank, world_size=world_size, rpc_backend_options=opts)
        except RuntimeError as e:
            twice = str(e)
        return me, peer, got, twice
    finally:
        rpc.shutdown()


def test_init_rpc_through_an_init_method_and_worker_infos():
    for rank, (me, peer, got, twice) in enumerate(run_ranks(_init_method, 2, backend=None, timeout=60)):
        assert (me.name, me.id) == (f"trainer{rank}", rank)
        assert (peer.name, peer.id) == (f"trainer{1 - rank}", 1 - rank) and repr(peer).startswith("WorkerInfo(id=")
        assert torch.equal(got, torch.full((2,), float(rank + 1)))
        assert "already initialized" in twice


def _process_group_then_rpc(rank, world_size, lib):
    """pytorch/examples' distributed/rpc/batch/parameter_server.py: init_process_group, then init_rpc, both
    env:// on the same MASTER_ADDR:MASTER_PORT (torch serves both from one multi-tenant TCPStore per port)."""
    import os

    import ptdist_testutil
    import torch.distributed as dist
    import torch.distributed.rpc as torch_rpc

    import harness

    if rank == 0:
        harness.store().set(f"pg_rpc_port_{lib}", str(ptdist_testutil.free_port()))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=harness.store().get(f"pg_rpc_port_{lib}").decode())
    c10d, api = (pt_dist, rpc) if lib == "pt_dist" else (dist, torch_rpc)
    c10d.init_process_group("tcp" if lib == "pt_dist" else "gloo", rank=rank, world_size=world_size)
    try:
        api.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
        got = api.rpc_sync(f"worker{(rank + 1) % world_size}", torch.add, args=(torch.ones(2), rank))
        t = torch.ones(1) * (rank + 1)
        c10d.all_reduce(t)
        api.shutdown()
        return got, t
    finally:
        c10d.destroy_process_group()


@pytest.mark.parametrize("lib", ["torch", "pt_dist"])
def test_init_process_group_then_init_rpc_share_master_port(lib):
    for rank, (got, t) in enumerate(run_ranks(_process_group_then_rpc, 2, lib, backend=None, timeout=120)):
        assert torch.equal(got, torch.full((2,), 1.0 + rank)) and t.item() == 3


# --- a request served on its connection's reader (threads.py) must not hold that connection ---------------------

_event = None


def call_back(caller, how):
    """On worker1: ask the caller for something; its answer comes on the connection this request came on."""
    if how == "rpc_sync":
        return rpc.rpc_sync(caller, torch.add, args=(torch.ones(1), 1))
    if how == "then":
        return rpc.rpc_async(caller, torch.add, args=(torch.ones(1), 1)).then(lambda f: f.wait() + 1).wait()
    futs = [rpc.rpc_async(caller, torch.add, args=(torch.ones(1), i)) for i in range(3)]
    return sum(torch.futures.wait_all(futs))  # a wait torch implements: no hand-over hook, the watchdog takes over


def wait_for_event():
    global _event
    import threading

    _event = _event or threading.Event()
    return _event.wait(10)


def set_event():
    global _event
    import threading

    _event = _event or threading.Event()
    _event.set()
    return True


def _reader_hand_over(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {how: rpc.rpc_sync("worker1", call_back, args=("worker0", how))
               for how in ("rpc_sync", "then", "wait_all")}
        t0 = time.monotonic()
        waiting = rpc.rpc_async("worker1", wait_for_event)  # blocks worker1's reader until the next request is read
        out["event"] = (rpc.rpc_sync("worker1", set_event), waiting.wait(), time.monotonic() - t0)
        return out
    finally:
        util.stop(store)


def test_a_request_served_on_the_reader_hands_the_connection_over_when_it_waits():
    out = run_ranks(_reader_hand_over, 2, backend=None, timeout=60)[0]
    assert torch.equal(out["rpc_sync"], torch.full((1,), 2.0)) and torch.equal(out["then"], torch.full((1,), 3.0))
    assert torch.equal(out["wait_all"], torch.full((1,), 6.0))
    set_ok, waited, elapsed = out["event"]
    assert set_ok and waited and elapsed < 5, out["event"]
