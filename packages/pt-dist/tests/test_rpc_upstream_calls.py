"""torch's RPC tests ported for issue 37 (defects 4-11), each run on pt_dist and on torch's own RPC.

Parametrised by ``side`` as test_rpc_upstream.py: the same rank function runs on pt_dist.rpc and on
torch.distributed.rpc (TensorPipe), so the torch run shows the behaviour is torch's. Cases, from
torch/testing/_internal/distributed/rpc/rpc_test.py:

- test_callback_with_ret (and its ``add_done_callback`` twin) -> test_callback_may_block_on_another_rpc (4).
- test_non_cont_tensors, plus a transpose -> test_non_contiguous_tensors_keep_their_strides (5), also with
  every tensor sent by address (cross-memory read).
- test_user_rrefs_confirmed / _remote -> test_rref_arguments_confirmed_before_the_call (6).
- test_rref_timeout -> test_to_here_after_remote_timed_out (7).
- test_async_function_wrong_return_type / _async / _remote, test_return_future / _async / _remote ->
  test_wrong_return_types (8).
- test_worker_id's unknown name, an out-of-range id -> test_unknown_destinations (9).
- test_set_and_get_default_rpc_timeout, test_default_timeout_used -> test_default_rpc_timeout (10).
- ``import torch.distributed`` makes ``rpc`` and ``autograd`` attributes -> test_subpackages_are_attributes (11).

Issue 48's defect 2.6 (the cases still differing):

- test_invalid_names' float ranks (``dst_rank +/- 0.5`` in sync, async and remote) -> test_float_ranks_are_value_errors.
- test_callback_with_error, test_callback_wrong_arg_num / _arg_type, test_callback_none, and an error set on the
  parent read through a chain of ``then`` callbacks -> test_callback_errors_propagate_through_then.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pt_dist.rpc as ours
import pytest
import torch
from pt_dist.rpc.rpc_agent import get_current_rpc_agent

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402

SIDES = pytest.mark.parametrize("side", util.SIDES)
rpc = None  # the side this rank runs (_start)
_raises = util.raises


def _start(side: str, rank: int, world_size: int, **options):
    global rpc
    rpc = util.side_modules(side)[0]
    return util.start_side(side, rank, world_size, **options)


def my_sleep_func(seconds=1):
    time.sleep(seconds)
    return torch.mul(torch.tensor(1), torch.tensor(1))


def _debug_info(rank=None):
    info = rpc._rref_context_get_debug_info() if rank is None else rpc.rpc_sync(f"worker{rank}", _debug_info)
    return {k: int(v) for k, v in info.items()}


# --- 4. a callback may block on another RPC -------------------------------------------------------------------

def _callbacks(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        dst = "worker1"

        def callback(fut0):
            fut2 = rpc.rpc_async(dst, torch.add, args=(fut0.wait(), 1)).then(lambda fut1: fut1.wait() + 1)
            return fut2.wait()

        out = {"then": rpc.rpc_async(dst, torch.add, args=(torch.ones(2, 2), 1)).then(callback).wait()}
        done, got = threading.Event(), []

        def on_done(fut0):
            got.append(rpc.rpc_sync(dst, torch.add, args=(fut0.wait(), 10)))
            done.set()

        rpc.rpc_async(dst, torch.add, args=(torch.ones(2), 1)).add_done_callback(on_done)
        out["add_done_callback"] = got[0] if done.wait(30) else None
        return out
    finally:
        stop()


@SIDES
def test_callback_may_block_on_another_rpc(side):
    out = run_ranks(_callbacks, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert torch.equal(out["then"], torch.ones(2, 2) + 3)
    assert torch.equal(out["add_done_callback"], torch.full((2,), 12.0))


# --- 5. strides ------------------------------------------------------------------------------------------------

def non_cont_test(t_view, t_cont):
    if t_view.is_contiguous():
        raise Exception("t_view is contiguous!")
    if not t_cont.is_contiguous():
        raise Exception("t_cont is not contiguous!")
    if not torch.equal(t_view, t_cont):
        raise Exception("t_view is not equal to t_cont!")
    return t_view


def _layout(t):
    return tuple(t.shape), t.stride(), t.is_contiguous()


def _strides(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        t = torch.rand(5, 5)
        t_view = t.narrow(1, 2, 2)
        ret = rpc.rpc_sync("worker1", non_cont_test, args=(t_view, t_view.contiguous()))
        tt = torch.arange(12.0).view(3, 4).t()
        by_address = get_current_rpc_agent().connections.peers[1].lend if side == "pt_dist" else None
        return (t_view, ret, tt, rpc.rpc_sync("worker1", _layout, args=(tt,)),
                rpc.rpc_sync("worker1", torch.clone, args=(tt,)), by_address)
    finally:
        stop()


@pytest.mark.parametrize("side", ["pt_dist", "pt_dist_by_address", "torch"])
def test_non_contiguous_tensors_keep_their_strides(side):
    """``pt_dist_by_address``: every tensor crosses by cross-memory read (rpc/cma_channel.py), not the socket."""
    if side == "pt_dist_by_address":
        out = run_ranks(_strides, 2, "pt_dist", backend=None, timeout=60, env={"PT_DIST_RPC_CMA_BYTES": "1"})[0]
        assert out[-1] is True, "the connection did not agree on cross-memory reads"
    else:
        out = run_ranks(_strides, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    t_view, ret, tt, seen, back, _ = out
    assert torch.equal(t_view, ret) and not ret.is_contiguous() and ret.stride() == t_view.stride()
    assert seen == ((4, 3), (1, 4), False)
    assert torch.equal(back, tt) and back.stride() == (1, 4)


# --- 6. RRef arguments are confirmed before the call ----------------------------------------------------------

def check_rref_confirmed(rref):
    return rref.confirmed_by_owner()


def _confirmed(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        out = []
        for _ in range(3):
            rref = rpc.remote("worker2", torch.add, args=(torch.zeros(2, 2), 1))  # owner: neither caller nor callee
            out.append(rpc.rpc_sync("worker1", check_rref_confirmed, args=(rref,)))
            rref = rpc.remote("worker2", torch.add, args=(torch.zeros(2, 2), 1))
            out.append(rpc.remote("worker1", check_rref_confirmed, args=(rref,)).to_here())
        return out
    finally:
        stop()


@SIDES
def test_rref_arguments_confirmed_before_the_call(side):
    assert run_ranks(_confirmed, 3, side, backend=None, timeout=60, fresh=side == "torch")[0] == [True] * 6


# --- 7. to_here after the remote() call timed out -------------------------------------------------------------

def _creation_timeout(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        rref = rpc.remote("worker1", my_sleep_func, args=(2,), timeout=0.01)
        out = {"creation": _raises(rref._get_future().wait)}
        util.wait_for(lambda: _debug_info().get("num_pending_users", 0) == 0, what="pending users flushed")
        out["to_here"] = _raises(rref.to_here)
        util.wait_for(lambda: (_debug_info(1)["num_owner_rrefs"], _debug_info(1)["num_forks"]) == (1, 1),
                      what="the owner's RRef and fork")
        return out
    finally:
        stop()


@SIDES
def test_to_here_after_remote_timed_out(side):
    out = run_ranks(_creation_timeout, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert out["creation"][0] == "RuntimeError" and "RPC ran for more than set timeout" in out["creation"][1]
    assert out["to_here"] is not None and out["to_here"][0] == "RuntimeError" and "RRef creation" in out["to_here"][1]


# --- 8. wrong return types --------------------------------------------------------------------------------------

@ours.functions.async_execution  # torch's decorator marks a function the same way (``_wrapped_async_rpc_function``)
def async_wrong_type():
    return torch.zeros(2, 2)


def return_future():
    return torch.futures.Future()


def _in_mode(mode, fn):
    dst = "worker1"
    if mode == "sync":
        return rpc.rpc_sync(dst, fn)
    if mode == "async":
        return rpc.rpc_async(dst, fn).wait()
    return rpc.remote(dst, fn).to_here(timeout=10)


def _wrong_types(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        return {(fn, mode): _raises(_in_mode, mode, {"wrong": async_wrong_type, "future": return_future}[fn])
                for fn in ("wrong", "future") for mode in ("sync", "async", "remote")}
    finally:
        stop()


@SIDES
def test_wrong_return_types(side):
    t0 = time.monotonic()
    out = run_ranks(_wrong_types, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    for (fn, mode), got in out.items():
        words = ("Functions decorated with @rpc.async_function must return a torch.futures.Future object,"
                 if fn == "wrong" else "Can not pickle torch.futures.Future")
        assert got is not None and got[0] == "RuntimeError" and words in got[1], (fn, mode, got)
    assert time.monotonic() - t0 < 40, "an error must answer at once, and shutdown must not wait on it"


# --- 9. unknown destinations ------------------------------------------------------------------------------------

def _destinations(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        return [_raises(rpc.get_worker_info, "WorkerUnknown"), _raises(rpc.rpc_sync, "nope", torch.add, args=(1, 1)),
                _raises(rpc.rpc_sync, 7, torch.add, args=(1, 1))]
    finally:
        stop()


@SIDES
def test_unknown_destinations(side):
    info, name, rank = run_ranks(_destinations, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert info[0] == "RuntimeError" and "could not find destination" in info[1]
    assert name[0] == "RuntimeError" and "could not find destination" in name[1]
    assert rank is not None and rank[0] == "RuntimeError", rank


# --- 10. the default timeout -----------------------------------------------------------------------------------

def _default_timeout(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        out = {"initial": rpc.get_rpc_timeout()}
        rpc._set_rpc_timeout(0.001)
        futs = [rpc.rpc_async("worker1", my_sleep_func, args=()) for _ in range(10)]
        out["short"] = [_raises(f.wait) for f in futs]
        rpc._set_rpc_timeout(200)
        fut1 = rpc.rpc_async("worker1", my_sleep_func, args=(1,))
        rpc._set_rpc_timeout(0.001)
        out["later"] = _raises(rpc.rpc_async("worker1", my_sleep_func, args=(1,)).wait)
        out["earlier"] = _raises(fut1.wait)
        rpc._set_rpc_timeout(0)  # zero: no timeout
        out["zero"] = _raises(rpc.rpc_async("worker1", my_sleep_func, args=(0.1,)).wait)
        out["got"] = rpc.get_rpc_timeout()
        rpc._set_rpc_timeout(rpc.constants.DEFAULT_RPC_TIMEOUT_SEC)
        return out
    finally:
        stop()


@SIDES
def test_default_rpc_timeout(side):
    out = run_ranks(_default_timeout, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert out["initial"] == 60.0 and out["got"] == 0.0
    for got in out["short"] + [out["later"]]:
        assert got is not None and got[0] == "RuntimeError" and "RPC ran for more than set timeout" in got[1], got
    assert out["earlier"] is None and out["zero"] is None


# --- 11. subpackages as attributes -----------------------------------------------------------------------------

@pytest.mark.parametrize("package", ["pt_dist", "torch.distributed"])
def test_subpackages_are_attributes(package):
    code = f"import {package} as d; print(d.rpc.__name__, d.autograd.__name__, callable(d.rpc.get_rpc_timeout))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"{package}.rpc", f"{package}.autograd", "True"]


# --- issue 48, 2.6: a float rank is torch's ValueError --------------------------------------------------------

def _float_ranks(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        calls = {"sync": rpc.rpc_sync, "async": rpc.rpc_async, "remote": rpc.remote}
        return {(mode, dst): _raises(call, dst, torch.add, args=(torch.ones(2, 2), 1))
                for mode, call in calls.items() for dst in (1 + 0.5, 1 - 0.5)}
    finally:
        stop()


@SIDES
def test_float_ranks_are_value_errors(side):
    out = run_ranks(_float_ranks, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert len(out) == 6
    for key, got in out.items():
        assert got is not None and got[0] == "ValueError", (key, got)
        assert got[1] == f"Cannot get WorkerInfo from name {key[1]}", (key, got)


# --- issue 48, 2.6: errors through then callbacks -------------------------------------------------------------

def raise_func():
    raise ValueError("Expected error")


def my_function(a, b, c):
    return a + b + c


def _callback_errors(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        dst = "worker1"
        seen = []

        def on_error(fut0):
            seen.append(_raises(fut0.wait))
            raise RuntimeError("Another expected error")

        def plus_one(fut):
            return fut.wait() + 1

        chained = rpc.rpc_async(dst, raise_func)
        for _ in range(3):
            chained = chained.then(plus_one)
        wrong_num = rpc.rpc_async(dst, torch.add, args=(torch.ones(2), 1))
        return {"with_error": _raises(rpc.rpc_async(dst, raise_func).then(on_error).wait), "seen": seen,
                "wrong_num": _raises(wrong_num.then(my_function).wait), "parent": _raises(wrong_num.wait),
                "wrong_type": _raises(rpc.rpc_async(dst, torch.add, args=(torch.ones(2), 1)).then(
                    lambda x: x + 1).wait),
                "none": _raises(rpc.rpc_async(dst, raise_func).then, None),
                "chained": _raises(chained.wait)}
    finally:
        stop()


@SIDES
def test_callback_errors_propagate_through_then(side):
    out = run_ranks(_callback_errors, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    prefix = "Got the following error when running the callback: "
    assert len(out["seen"]) == 1 and out["seen"][0][0] == "ValueError" and "Expected error" in out["seen"][0][1]
    assert out["with_error"][0] == "RuntimeError"
    assert out["with_error"][1].startswith(prefix + "RuntimeError: Another expected error"), out["with_error"]
    assert out["parent"] is None
    assert out["wrong_num"][0] == "RuntimeError", out["wrong_num"]
    assert out["wrong_num"][1].startswith(prefix + "TypeError: ") and \
        "my_function() missing 2 required positional arguments" in out["wrong_num"][1], out["wrong_num"]
    assert out["wrong_type"][0] == "RuntimeError" and \
        out["wrong_type"][1].startswith(prefix + "TypeError: unsupported operand type(s) for +"), out["wrong_type"]
    assert out["none"][0] == "TypeError" and "incompatible function arguments" in out["none"][1], out["none"]
    nested = prefix + "RuntimeError: " + prefix + "RuntimeError: " + prefix + "ValueError: "  # one per then
    assert out["chained"][0] == "RuntimeError" and out["chained"][1].startswith(nested), out["chained"]
    assert "Expected error" in out["chained"][1] and out["chained"][1].count(prefix) == 3, out["chained"]
