"""torch's distributed-autograd tests ported for issue 37, each run on pt_dist and on torch's own RPC.

Every test is parametrised by ``side``: the same rank function runs on pt_dist.rpc / pt_dist.autograd and on
torch.distributed.rpc (TensorPipe) / torch.distributed.autograd (``rpc_testutil.start_side``), so the
torch run shows the behaviour is torch's. Cases, from torch/testing/_internal/distributed/rpc/:

- dist_autograd_test.py: test_backward_simple / _self, test_backward_rref / _nested,
  test_backward_multiple_round_trips, test_backward_simple_python_udf, test_mixed_requires_grad,
  test_graph_for_remote_call (all in ExecMode.REMOTE) -> test_backward_through_remote_to_here (defect 1);
  test_post_hooks -> test_accumulate_grad_hooks_run (defect 2); test_backward_invalid_args ->
  test_backward_argument_errors (defect 9).
- rpc_test.py's test_rref_backward (``backward(100)``): an unknown context id is named before any check of the
  roots -> test_backward_unknown_context_checked_first (issue 48, defect 2.6).
- rpc_test.py: test_owner_rref_backward, test_user_rref_backward -> test_rref_backward (defect 3).

The RPC-call defects (4-11) are in test_rpc_upstream_calls.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pt_dist.rpc as ours
import pytest
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402

SIDES = pytest.mark.parametrize("side", util.SIDES)
rpc = dist_autograd = None  # the side this rank runs (_start): pt_dist's modules, or torch's


def _start(side: str, rank: int, world_size: int, **options):
    global rpc, dist_autograd
    rpc, dist_autograd = util.side_modules(side)
    return util.start_side(side, rank, world_size, **options)


_raises = util.raises


# --- 1. backward through remote(...).to_here() ---------------------------------------------------------------

def my_py_add(t1, t2):
    return torch.add(t1, t2)


def _torch_ones(sizes, requires_grad=False):
    return torch.ones(sizes, requires_grad=requires_grad)


def my_rref_add(rref_t1, t2):
    return torch.add(rref_t1.local_value(), t2)


def my_nested_rref_add(dst, rref_t1, t2):
    return rpc.rpc_sync(dst, my_rref_add, args=(rref_t1, t2))


def _mixed_requires_grad_operaton(t1, t2):
    if t2.requires_grad:
        return t1 - t2
    return t1 * t2


def _owner_grad(context_id, rref):
    return dist_autograd.get_gradients(context_id)[rref.local_value()]


def _graph_counts(context_id) -> tuple[int, int]:
    """(send functions, recv functions) of the context on this worker."""
    if rpc is ours:
        from pt_dist.autograd import container

        ctx = container.retrieve(context_id)
        return len(ctx.sends), len(ctx.recv_anchors)
    ctx = dist_autograd._retrieve_context(context_id)
    return len(ctx._send_functions()), len(ctx._recv_functions())


def _remote(dst, fn, *args):
    return rpc.remote(dst, fn, args=args).to_here()


def _dist_grads(loss, *leaves):
    """dist_autograd_test's _verify_backwards_remote: backward, then the context's grads, exactly for ``leaves``."""
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [loss(cid)])
        grads = dist_autograd.get_gradients(cid)
        return [grads.get(t) for t in leaves], len(grads)


def _remote_backward(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        torch.manual_seed(0)
        t1, t2 = torch.rand(3, 3, requires_grad=True), torch.rand(3, 3, requires_grad=True)
        out = {}
        for name, dst, fn in (("simple", "worker1", torch.add), ("simple_self", "worker0", torch.add),
                              ("python_udf", "worker1", my_py_add)):
            out[name] = _dist_grads(lambda cid, dst=dst, fn=fn: _remote(dst, fn, t1, t2).sum(), t1, t2)
        t3, t4, t5 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
        n = [0]

        def hop(fn, *args):
            n[0] += 1
            return _remote(f"worker{1 + n[0] % 2}", fn, *args)

        def round_trips(cid):
            val = hop(torch.mul, t3, hop(torch.add, t1, t2))
            s1, s2 = hop(torch.stack, (t4, val)), hop(torch.stack, (t5, val))
            val = hop(torch.bmm, s1, s2)
            return hop(torch.matmul, val, val).sum()

        out["round_trips"] = _dist_grads(round_trips, t1, t2, t3, t4, t5)
        plain = torch.rand(3, 3)
        out["mixed"] = _dist_grads(lambda cid: _remote("worker1", _mixed_requires_grad_operaton, t1, plain).sum(),
                                   t1, plain)
        for name, callee, owner in (("rref", "worker1", "worker1"), ("rref_nested", "worker1", "worker2")):
            with dist_autograd.context() as cid:
                rref_t1 = rpc.remote(owner, _torch_ones, args=((3, 3),), kwargs={"requires_grad": True})
                rref = (rpc.remote(callee, my_rref_add, args=(rref_t1, t2)) if callee == owner
                        else rpc.remote(callee, my_nested_rref_add, args=(owner, rref_t1, t2)))
                dist_autograd.backward(cid, [rref.to_here().sum()])
                owner_grad = rpc.rpc_sync(owner, _owner_grad, args=(cid, rref_t1))
                out[name] = (dist_autograd.get_gradients(cid)[t2], owner_grad)
        with dist_autograd.context() as cid:
            ret = rpc.remote("worker1", torch.add, args=(t1, t2)).to_here()
            out["graph"] = (_graph_counts(cid), ret.requires_grad, "RecvRpcBackward" in ret.grad_fn.name())
        return out
    finally:
        stop()


@SIDES
def test_backward_through_remote_to_here(side):
    out = run_ranks(_remote_backward, 3, side, backend=None, timeout=90, fresh=side == "torch")[0]
    torch.manual_seed(0)
    t1, t2 = torch.rand(3, 3, requires_grad=True), torch.rand(3, 3, requires_grad=True)
    t3, t4, t5 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
    ones = torch.ones(3, 3)
    for name in ("simple", "simple_self", "python_udf"):
        (g1, g2), n = out[name]
        assert n == 2 and torch.equal(g1, ones) and torch.equal(g2, ones), name
    val = torch.mul(t3, torch.add(t1, t2))
    s1, s2 = torch.stack((t4, val)), torch.stack((t5, val))
    val = torch.bmm(s1, s2)
    torch.matmul(val, val).sum().backward()
    grads, n = out["round_trips"]
    assert n == 5
    for got, t in zip(grads, (t1, t2, t3, t4, t5)):
        torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-6)
    plain = torch.rand(3, 3)
    (mixed_t1, mixed_plain), n = out["mixed"]
    assert n == 1 and mixed_plain is None and torch.equal(mixed_t1, plain)  # d(t1 * plain)/dt1
    for name in ("rref", "rref_nested"):
        assert torch.equal(out[name][0], ones) and torch.equal(out[name][1], ones), name
    assert out["graph"] == ((1, 1), True, True), out["graph"]


# --- 2. the leaves' AccumulateGrad hooks ----------------------------------------------------------------------

def _leaf_hooks(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        out, calls = {}, []
        t = torch.rand(10, 10, requires_grad=True)
        a = t + t
        accumulate_grad_0 = a.grad_fn.next_functions[0][0]
        accumulate_grad_0.register_hook(lambda output_grads, input_grads: calls.append(1))
        accumulate_grad_0.register_hook(lambda output_grads, input_grads: calls.append(2))
        accumulate_grad_1 = a.grad_fn.next_functions[1][0]
        accumulate_grad_1.register_hook(lambda output_grads, input_grads: calls.append(2))
        with dist_autograd.context() as cid:
            dist_autograd.backward(cid, [a.sum()])
            grads = dist_autograd.get_gradients(cid)
            out["post_hooks"] = (sum(calls), len(grads), t in grads)
        # a pre hook's result is what the context accumulates; tensor hooks run, post-accumulate-grad hooks do not
        u, seen = torch.ones(3, requires_grad=True), {"tensor": 0, "post_accumulate": 0, "pre": 0}
        b = u * 3
        b.grad_fn.next_functions[0][0].register_prehook(lambda g: seen.update(pre=seen["pre"] + 1) or (g[0] * 2,))
        u.register_hook(lambda g: seen.update(tensor=seen["tensor"] + 1))
        u.register_post_accumulate_grad_hook(lambda p: seen.update(post_accumulate=seen["post_accumulate"] + 1))
        with dist_autograd.context() as cid:
            dist_autograd.backward(cid, [b.sum()])
            out["pre_hook"] = (dict(seen), dist_autograd.get_gradients(cid)[u], u.grad)
        (u * 3).sum().backward()  # a local backward still runs the post-accumulate-grad hook
        out["local_post_accumulate"] = seen["post_accumulate"]
        # the pass that reaches a sent leaf runs on another thread, from the gradient worker1 sends back
        v, remote_calls = torch.ones(2, requires_grad=True), []
        keep = v * 1
        keep.grad_fn.next_functions[0][0].register_hook(lambda o, i: remote_calls.append(1))
        with dist_autograd.context() as cid:
            dist_autograd.backward(cid, [rpc.rpc_sync("worker1", torch.mul, args=(v, 3.0)).sum()])
            out["over_rpc"] = (len(remote_calls), dist_autograd.get_gradients(cid)[v], v.grad)
        return out
    finally:
        stop()


@SIDES
def test_accumulate_grad_hooks_run(side):
    out = run_ranks(_leaf_hooks, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    assert out["post_hooks"] == (5, 1, True)
    seen, grad, dot_grad = out["pre_hook"]
    assert seen == {"tensor": 1, "post_accumulate": 0, "pre": 1}, seen
    assert torch.equal(grad, torch.full((3,), 6.0)) and dot_grad is None
    assert out["local_post_accumulate"] == 1
    n, grad, dot_grad = out["over_rpc"]
    assert n == 1 and torch.equal(grad, torch.full((2,), 3.0)) and dot_grad is None


# --- 3. RRef.backward -----------------------------------------------------------------------------------------

def _sum(x):
    return x.sum()


def _identity(x):
    return x


def _rref_backward(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        out = {}
        t1 = torch.rand(10, 10, requires_grad=True)
        rpc.RRef(t1.sum() + t1.sum()).backward()
        out["owner_local"] = t1.grad
        with dist_autograd.context() as cid:
            rpc.RRef(rpc.rpc_sync("worker1", torch.add, args=(t1, t1)).sum()).backward(cid)
            out["owner_dist"] = dist_autograd.get_gradients(cid)[t1]
        with dist_autograd.context() as cid:
            rref = rpc.RRef(rpc.rpc_sync("worker1", torch.add, args=(t1, t1)).sum())
            rref.backward(cid, retain_graph=True)
            rref.backward(cid)
            out["owner_twice"] = dist_autograd.get_gradients(cid)[t1]
        out["owner_errors"] = [
            _raises(rpc.RRef(torch.rand(10)).backward),
            _raises(rpc.RRef(torch.rand(10, requires_grad=True)).backward),
            _raises(rpc.RRef(torch.rand(10, requires_grad=True).sum()).backward, 100),
            _raises(rpc.RRef("foo").backward)]
        t = torch.rand(10, requires_grad=True)
        with dist_autograd.context() as cid:
            rref = rpc.remote("worker1", _sum, args=(t,))
            rref.backward(cid, retain_graph=True)
            rref.backward(dist_autograd_ctx_id=cid)
            out["user_twice"] = dist_autograd.get_gradients(cid)[t]
        with dist_autograd.context() as cid:
            rref = rpc.remote("worker1", _identity, args=("foo",))
            out["user_errors"] = [_raises(rref.backward, cid), _raises(rref.backward)]
        return out
    finally:
        stop()


@SIDES
def test_rref_backward(side):
    out = run_ranks(_rref_backward, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    two = torch.full((10, 10), 2.0)
    assert torch.equal(out["owner_local"], two) and torch.equal(out["owner_dist"], two)
    assert torch.equal(out["owner_twice"], 2 * two) and torch.equal(out["user_twice"], torch.full((10,), 2.0))
    no_grad, not_scalar, no_context, not_tensor = out["owner_errors"]
    assert no_grad[0] == "RuntimeError" and "does not require grad and does not have a grad_fn" in no_grad[1]
    assert not_scalar[0] == "RuntimeError" and "grad can be implicitly created only for scalar outputs" in not_scalar[1]
    assert no_context[0] == "RuntimeError" and "Could not find autograd context with id: 100" in no_context[1]
    assert not_tensor[0] == "RuntimeError" and "RRef should contain a tensor for .backward()" in not_tensor[1]
    not_tensor, no_context = out["user_errors"]
    assert not_tensor[0] == "RuntimeError" and "RRef should contain a tensor for .backward()" in not_tensor[1]
    assert no_context == ("RuntimeError", "User RRefs require 'dist_autograd_ctx_id' to be specified") or (
        no_context[0] == "RuntimeError" and "User RRefs require 'dist_autograd_ctx_id'" in no_context[1])


# --- 9. backward's argument errors ----------------------------------------------------------------------------

def _backward_errors(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        with dist_autograd.context() as cid:
            return [_raises(dist_autograd.backward, cid, None), _raises(dist_autograd.backward, None, None),
                    _raises(dist_autograd.backward, cid, []),
                    _raises(dist_autograd.backward, cid, [torch.rand(3, 3)]),
                    _raises(dist_autograd.backward, cid, [torch.rand(3, 3, requires_grad=True)]),
                    _raises(dist_autograd.backward, cid, [torch.rand(1, requires_grad=True)])]
    finally:
        stop()


@SIDES
def test_backward_argument_errors(side):
    out = run_ranks(_backward_errors, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    expected = [("TypeError", "incompatible function arguments"), ("TypeError", "incompatible function arguments"),
                ("RuntimeError", "No tensors provided for gradient computation"),
                ("RuntimeError", "requires_grad not set on"),
                ("RuntimeError", "is not a scalar, all roots need to be scalar"),
                ("RuntimeError", "does not have a valid gradient function")]
    for got, (kind, words) in zip(out, expected):
        assert got is not None and got[0] == kind and words in got[1], (got, kind, words)


# --- issue 48, 2.6: an unknown context id before the roots' checks ------------------------------------------

def _backward_unknown_context(rank, world_size, side):
    stop = _start(side, rank, world_size)
    try:
        if rank != 0:
            return None
        roots = {"no_grad": [torch.rand(3, 3)], "not_scalar": [torch.rand(3, requires_grad=True)],
                 "leaf": [torch.rand(1, requires_grad=True)], "valid": [torch.rand(3, requires_grad=True).sum()]}
        return {name: _raises(dist_autograd.backward, 100, r) for name, r in roots.items()}
    finally:
        stop()


@SIDES
def test_backward_unknown_context_checked_first(side):
    out = run_ranks(_backward_unknown_context, 2, side, backend=None, timeout=60, fresh=side == "torch")[0]
    for name, got in out.items():
        assert got is not None and got[0] == "RuntimeError", (name, got)
        assert got[1].splitlines()[0] == "Could not find autograd context with id: 100", (name, got)
