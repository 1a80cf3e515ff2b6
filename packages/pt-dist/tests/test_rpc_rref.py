"""RRef: owner and user RRefs, to_here / local_value, proxies, forks to a third worker, reference counting.

Ported from torch/testing/_internal/distributed/rpc/rpc_test.py (``RpcTest``: test_remote_same_worker,
test_py_rref_args, test_rref_forward_chain, test_local_rref_no_fork, test_return_local_rrefs,
test_local_value_not_on_owner, test_rref_proxy_class, test_rref_proxy_reuse, test_py_raise_in_user_func
through remote, test_user_rrefs_confirmed, test_rref_context_debug_info). The owner's counts
(``_rref_context_get_debug_info``) are what the lifetime tests observe: the value is dropped once no user holds
it, including a user on a third worker that got the RRef forked from another user.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pt_dist.rpc as rpc
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402

_kept: list = []


class MyClass:
    def __init__(self, a):
        self.a = a

    def my_instance_method(self, b):
        return self.a + b

    def increment(self, n=1):
        self.a += n
        return self.a


def raise_func():
    raise ValueError("Expected error")


def owner_counts():
    return rpc._rref_context_get_debug_info()


def keep(rref):
    _kept.append(rref)
    return rref.to_here()


def drop():
    _kept.clear()
    gc.collect()


def local_rref(value):
    return rpc.RRef(value)


def owner_local_value(rref):
    return rref.is_owner(), rref.local_value()


def rref_forward_chain(dst, world_size, rref, ttl):
    """torch's rref_forward_chain: pass an RRef along the workers ``ttl`` times, then fetch it at the end."""
    if ttl > 0:
        nxt = (rpc.get_worker_info().id + 1) % world_size
        return rpc.rpc_sync(nxt, rref_forward_chain, args=(nxt, world_size, rref, ttl - 1))
    return rref.to_here()


def _counts_on(rank):
    return rpc.rpc_sync(rank, owner_counts)


def _lifetime(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {}
        rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
        out["to_here"] = rref.to_here()
        out["owner"] = (rref.owner(), rref.owner_name(), rref.is_owner(), rref.confirmed_by_owner())
        out["while_held"] = _counts_on(1)
        try:
            rref.local_value()
        except RuntimeError as e:
            out["not_owner"] = str(e)
        del rref
        gc.collect()
        util.wait_for(lambda: _counts_on(1)["num_owner_rrefs"] == 0, what="the owner to drop the value")
        out["after_delete"] = _counts_on(1)
        # fork a user RRef to a third worker, then drop ours: the owner keeps the value for worker2
        rref = rpc.remote("worker1", MyClass, args=(5,))
        out["third_sees"] = rpc.rpc_sync("worker2", keep, args=(rref,)).a
        out["third_forks"] = _counts_on(1)
        del rref
        gc.collect()
        util.wait_for(lambda: _counts_on(1)["num_forks"] == 1, what="our fork's delete")
        out["only_third"] = _counts_on(1)
        out["third_still"] = rpc.rpc_sync("worker2", _kept_value)
        rpc.rpc_sync("worker2", drop)
        util.wait_for(lambda: _counts_on(1)["num_owner_rrefs"] == 0, what="the third worker's delete")
        out["after_third"] = _counts_on(1)
        # an owner's own RRef(value) returned to us; then our user sent back to the owner
        rref = rpc.rpc_sync("worker1", local_rref, args=(torch.arange(3),))
        out["returned_local"] = (rref.is_owner(), rref.owner().id, rref.to_here())
        out["back_to_owner"] = rpc.rpc_sync("worker1", owner_local_value, args=(rref,))
        del rref
        gc.collect()
        util.wait_for(lambda: _counts_on(1)["num_owner_rrefs"] == 0, what="the returned RRef's delete")
        out["pending_here"] = rpc._rref_context_get_debug_info()
        return out
    finally:
        util.stop(store)


def _kept_value():
    return _kept[0].to_here().a


def test_owner_frees_the_value_after_the_last_user_including_a_fork_to_a_third_worker():
    out = run_ranks(_lifetime, 3, backend=None, timeout=60)[0]
    assert torch.equal(out["to_here"], torch.full((2,), 2.0))
    info, name, is_owner, confirmed = out["owner"]
    assert (info.id, name, is_owner, confirmed) == (1, "worker1", False, True)
    assert out["while_held"]["num_owner_rrefs"] == 1 and out["while_held"]["num_forks"] == 1
    assert "non-local reference" in out["not_owner"]
    assert out["after_delete"]["num_owner_rrefs"] == 0 and out["after_delete"]["num_forks"] == 0
    assert out["third_sees"] == 5
    assert out["third_forks"]["num_forks"] == 2 and out["third_forks"]["num_owner_rrefs"] == 1
    assert out["only_third"]["num_owner_rrefs"] == 1 and out["third_still"] == 5
    assert out["after_third"] == {"num_owner_rrefs": 0, "num_forks": 0, "num_pending_users": 0,
                                  "num_pending_children": 0}
    is_owner, owner_id, value = out["returned_local"]
    assert (is_owner, owner_id) == (False, 1) and torch.equal(value, torch.arange(3))
    assert out["back_to_owner"][0] is True and torch.equal(out["back_to_owner"][1], torch.arange(3))
    assert out["pending_here"]["num_pending_users"] == 0 and out["pending_here"]["num_pending_children"] == 0


def _usage(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {}
        mine = rpc.remote("worker0", torch.add, args=(torch.ones(2), 3))
        out["same_worker"] = (mine.is_owner(), mine.local_value(), mine.to_here())
        local = rpc.RRef(torch.ones(2) * 7)
        out["local_rref_arg"] = rpc.rpc_sync("worker1", _to_here_plus, args=(local, 1))
        obj = rpc.remote("worker1", MyClass, args=(2,))
        out["proxy_sync"] = obj.rpc_sync().my_instance_method(3)
        out["proxy_async"] = obj.rpc_async().my_instance_method(4).wait()
        out["proxy_remote"] = obj.remote().my_instance_method(5).to_here()
        sync = obj.rpc_sync()
        out["proxy_reuse"] = [sync.increment(), sync.increment(2), obj.to_here().a]
        try:
            obj.rpc_sync().no_such_method()
        except AttributeError as e:
            out["proxy_missing"] = str(e)
        bad = rpc.remote("worker1", raise_func)
        try:
            bad.to_here()
        except ValueError as e:
            out["remote_raise"] = str(e)
        x = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
        y = rpc.remote("worker2", torch.add, args=(torch.ones(2), 2))
        out["rref_args"] = rpc.rpc_sync("worker2", _sum_rrefs, args=(x, y))
        out["forward_chain"] = rref_forward_chain(0, world_size, rpc.remote("worker1", torch.ones, args=(3,)), 4)
        try:
            import pickle

            pickle.dumps(x)
        except RuntimeError as e:
            out["plain_pickle"] = str(e)
        return out
    finally:
        util.stop(store)


def _to_here_plus(rref, n):
    return rref.to_here() + n


def _sum_rrefs(a, b):
    return a.to_here() + b.to_here()


def test_rref_values_proxies_errors_and_forwarding():
    out = run_ranks(_usage, 3, backend=None, timeout=60)[0]
    is_owner, local, here = out["same_worker"]
    assert is_owner and torch.equal(local, torch.full((2,), 4.0)) and torch.equal(here, local)
    assert torch.equal(out["local_rref_arg"], torch.full((2,), 8.0))
    assert (out["proxy_sync"], out["proxy_async"], out["proxy_remote"]) == (5, 6, 7)
    assert out["proxy_reuse"] == [3, 5, 5]
    assert "no_such_method" in out["proxy_missing"]
    assert "Expected error" in out["remote_raise"] and "On WorkerInfo(id=1, name=worker1)" in out["remote_raise"]
    assert torch.equal(out["rref_args"], torch.full((2,), 5.0))
    assert torch.equal(out["forward_chain"], torch.ones(3))
    assert "only picklable inside an RPC" in out["plain_pickle"]
