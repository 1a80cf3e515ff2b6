"""Distributed autograd and DistributedOptimizer against single-process autograd.

Ported from torch/testing/_internal/distributed/rpc/dist_autograd_test.py (``DistAutogradTest``:
test_autograd_context, test_nested_context, test_backward_simple, test_backward_multiple_round_trips,
test_backward_nested_rpc (a third worker), test_context_cleanup_tensor_with_grad, test_grad_only_on_return_value,
test_no_graph_with_tensors_not_require_grad, test_backward_without_context) and
torch/testing/_internal/distributed/rpc/dist_optimizer_test.py (test_dist_optim), plus the issue's parity test:
a model split over three workers, pipeline style, trained for three steps with DistributedOptimizer ends with
exactly the parameters of the same model trained in one process; and two concurrent contexts on the same
parameters keep their gradients apart (and out of ``.grad``).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pt_dist.autograd as dist_autograd
import pt_dist.rpc as rpc
import torch
from pt_dist.autograd import container
from pt_dist.optim import DistributedOptimizer
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402


def my_py_add(a, b):
    return a + b


def nested_add(third, a, b):
    """On worker1: add on worker ``third``, multiply here (the graph spans three workers)."""
    return rpc.rpc_sync(third, torch.add, args=(a, b)) * a


def num_contexts():
    return dist_autograd._get_debug_info()["num_current_contexts"]


def _leaves():
    torch.manual_seed(0)
    return [torch.rand(3, 3, requires_grad=True) for _ in range(5)]


def _round_trips(ts, call):
    """dist_autograd_test's multiple round trips: each op on a worker ``call`` chooses, the rest local."""
    t1, t2, t3, t4, t5 = ts
    val = call(torch.add, (t1, t2))
    val = call(torch.mul, (t3, val))
    s1 = call(torch.stack, ([t4, val],))
    s2 = call(torch.stack, ([t5, val],))
    val = call(torch.bmm, (s1, s2))
    val = call(torch.matmul, (val, val))
    return call(torch.sum, (val,))


def _autograd(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        out = {}
        with dist_autograd.context() as c1:
            pass
        with dist_autograd.context() as c2:
            pass
        out["ids"] = (c1, c2)
        try:
            with dist_autograd.context():
                with dist_autograd.context():
                    pass
        except RuntimeError as e:
            out["nested"] = str(e)
        try:
            dist_autograd.get_gradients(c1)
        except RuntimeError as e:
            out["released"] = str(e)
        ts = _leaves()
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", my_py_add, args=(ts[0], ts[1])).sum()
            out["callee_has_context"] = rpc.rpc_sync("worker1", num_contexts)
            dist_autograd.backward(cid, [loss])
            out["simple"] = [dist_autograd.get_gradients(cid)[t] for t in ts[:2]]
        out["grad_untouched"] = [t.grad for t in ts]
        util.wait_for(lambda: rpc.rpc_sync("worker1", num_contexts) == 0, what="the callee's context release")
        for where in ("local", "remote", "alternate"):
            ts, n = _leaves(), [0]

            def call(fn, args, n=n, where=where):
                n[0] += 1
                to = {"local": 0, "remote": 1, "alternate": n[0] % 2}[where]
                return rpc.rpc_sync(f"worker{to}", fn, args=args)

            with dist_autograd.context() as cid:
                dist_autograd.backward(cid, [_round_trips(ts, call)])
                grads = dist_autograd.get_gradients(cid)
                out[f"round_trips_{where}"] = [grads[t] for t in ts]
        ts = _leaves()
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", nested_add, args=("worker2", ts[0], ts[1])).sum()
            dist_autograd.backward(cid, [loss])
            grads = dist_autograd.get_gradients(cid)
            out["nested_rpc"] = [grads[t] for t in ts[:2]]
        with dist_autograd.context() as cid:
            plain = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), torch.ones(2)))
            out["no_grad_needed"] = (plain.requires_grad, sorted(container.retrieve(cid).sends))
        ts = _leaves()
        with dist_autograd.context():
            loss = rpc.rpc_sync("worker1", torch.add, args=(ts[0], ts[1])).sum()
            try:
                loss.backward()
            except RuntimeError as e:
                out["local_backward"] = str(e)
        return out
    finally:
        util.stop(store)


def test_backward_across_workers_matches_local_autograd():
    out = run_ranks(_autograd, 3, backend=None, timeout=90)[0]
    c1, c2 = out["ids"]
    assert c1 != c2 and c1 >> 48 == 0
    assert "Already have an autograd context id" in out["nested"]
    assert "Could not find autograd context with id" in out["released"]
    assert out["callee_has_context"] == 1
    assert all(torch.equal(g, torch.ones(3, 3)) for g in out["simple"])
    assert out["grad_untouched"] == [None] * 5, "distributed gradients must not land in .grad"
    ts = _leaves()
    _round_trips(ts, lambda fn, args: fn(*args)).backward()
    for where in ("local", "remote", "alternate"):
        for got, t in zip(out[f"round_trips_{where}"], ts):
            assert torch.allclose(got, t.grad, rtol=1e-6, atol=0), where
    ts = _leaves()
    ((ts[0] + ts[1]) * ts[0]).sum().backward()
    assert torch.allclose(out["nested_rpc"][0], ts[0].grad) and torch.allclose(out["nested_rpc"][1], ts[1].grad)
    assert out["no_grad_needed"] == (False, [])
    assert "outside pt_dist.autograd.backward" in out["local_backward"]


class Stage(nn.Module):
    def __init__(self, state, act: bool):
        super().__init__()
        self.lin = nn.Linear(state["weight"].shape[1], state["weight"].shape[0])
        self.lin.load_state_dict(state)
        self.act = act

    def forward(self, x):
        y = self.lin(x)
        return torch.tanh(y) if self.act else y

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def weights(self):
        return {k: v.clone() for k, v in self.lin.state_dict().items()}


def _reference_model():
    torch.manual_seed(1)
    return nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(3, 1)


def _batches():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)) for _ in range(3)]


def _parity(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        l1, l2, head = _reference_model()
        s1 = rpc.remote("worker1", Stage, args=(l1.state_dict(), True))
        s2 = rpc.remote("worker2", Stage, args=(l2.state_dict(), False))
        params = s1.rpc_sync().parameter_rrefs() + s2.rpc_sync().parameter_rrefs()
        params += [rpc.RRef(p) for p in head.parameters()]
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.1, momentum=0.9)
        losses = []
        for x, y in _batches():
            with dist_autograd.context() as cid:
                h1 = s1.rpc_sync().forward(x)
                h2 = s2.rpc_sync().forward(h1)
                loss = nn.functional.mse_loss(head(h2), y)
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
                losses.append(loss.item())
        return {"losses": losses, "l1": s1.rpc_sync().weights(), "l2": s2.rpc_sync().weights(),
                "head": {k: v.clone() for k, v in head.state_dict().items()}}
    finally:
        util.stop(store)


def test_split_model_trained_with_distributed_optimizer_equals_single_process():
    out = run_ranks(_parity, 3, backend=None, timeout=90)[0]
    l1, l2, head = _reference_model()
    init = {k: v.clone() for k, v in l1.state_dict().items()}
    opt = torch.optim.SGD([*l1.parameters(), *l2.parameters(), *head.parameters()], lr=0.1, momentum=0.9)
    losses = []
    for x, y in _batches():
        opt.zero_grad()
        loss = nn.functional.mse_loss(head(l2(torch.tanh(l1(x)))), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert out["losses"] == losses
    for name, mod in (("l1", l1), ("l2", l2), ("head", head)):
        for k, v in mod.state_dict().items():
            assert torch.equal(out[name][k], v), (name, k, (out[name][k] - v).abs().max())
    assert not torch.equal(out["l1"]["weight"], init["weight"]), "the remote stage must have been trained"


def _two_contexts(rank, world_size):
    store = util.start(rank, world_size)
    try:
        if rank != 0:
            return None
        w = torch.ones(4, requires_grad=True)
        barrier, grads, errors = threading.Barrier(2), {}, []

        def train(scale):
            try:
                with dist_autograd.context() as cid:
                    y = rpc.rpc_sync("worker1", torch.mul, args=(w, float(scale)))
                    barrier.wait(timeout=20)  # both contexts hold a graph through w at once
                    dist_autograd.backward(cid, [(y * y).sum()])
                    barrier.wait(timeout=20)
                    grads[scale] = dist_autograd.get_gradients(cid)[w]
            except Exception as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=train, args=(s,)) for s in (2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return grads, errors, w.grad
    finally:
        util.stop(store)


def test_two_concurrent_contexts_keep_their_gradients_apart():
    grads, errors, dot_grad = run_ranks(_two_contexts, 2, backend=None, timeout=60)[0]
    assert errors == []
    # d/dw sum((s w)^2) = 2 s^2 w
    assert torch.equal(grads[2], torch.full((4,), 8.0)) and torch.equal(grads[3], torch.full((4,), 18.0))
    assert dot_grad is None
