"""DTensor's sharding propagation on pt_dist groups next to torch's own DTensor on a gloo group in the same
ranks: placements and values after each op (torch's test/distributed/tensor/test_pointwise_ops.py,
test_math_ops.py, test_matrix_ops.py, test_view_ops.py, test_tensor_ops.py cases), then a tensor-parallel MLP
trained with the single-tensor optimizers and clip_grad_norm_ (test_tp_examples.py, test_optimizers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.tensor as tt
from pt_dist.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_device_mesh import _both_worlds  # noqa: E402
from test_dtensor import _close_up, _meshes, _rank_tensor  # noqa: E402


# -- sharding propagation: placements and values after ops, next to torch's (torch's test/distributed/tensor/
# test_pointwise_ops.py, test_math_ops.py, test_matrix_ops.py, test_view_ops.py, test_tensor_ops.py cases) -----------
def _shard(t, dim):
    return t.redistribute(t.device_mesh, [(Shard if isinstance(t, DTensor) else tt.Shard)(dim)])


def _s1(t):
    return _shard(t, 1)


def _s0(t):
    return _shard(t, 0)


# a: [4, 6] Shard(0), b: [4, 6] Replicate, c: [6, 5] Replicate, p: [4, 6] Partial (each rank's own term)
_OPS = {
    "add S S": lambda a, b, c, p: a + a, "add S R": lambda a, b, c, p: a + b, "add R S": lambda a, b, c, p: b + a,
    "sub alpha": lambda a, b, c, p: torch.sub(a, b, alpha=0.5), "mul scalar": lambda a, b, c, p: a * 2.0,
    "add P P": lambda a, b, c, p: p + p, "mul P 2": lambda a, b, c, p: p * 2, "add P R": lambda a, b, c, p: p + b,
    "mul P R": lambda a, b, c, p: p * b, "add P 1": lambda a, b, c, p: p + 1, "neg P": lambda a, b, c, p: -p,
    "div R S": lambda a, b, c, p: b / (a.abs() + 1), "sqrt": lambda a, b, c, p: (a * a).sqrt(),
    "maximum": lambda a, b, c, p: torch.maximum(a, b), "where": lambda a, b, c, p: torch.where(a > 0, a, b),
    "relu": lambda a, b, c, p: torch.relu(a), "gelu": lambda a, b, c, p: torch.nn.functional.gelu(a),
    "broadcast row": lambda a, b, c, p: a * b[0], "to bf16 P": lambda a, b, c, p: p.to(torch.bfloat16),
    "sum": lambda a, b, c, p: a.sum(), "sum 0": lambda a, b, c, p: a.sum(0), "sum 1": lambda a, b, c, p: a.sum(1),
    "sum keepdim": lambda a, b, c, p: a.sum(0, keepdim=True), "mean": lambda a, b, c, p: a.mean(),
    "mean 1": lambda a, b, c, p: a.mean(1), "sum P": lambda a, b, c, p: p.sum(0),
    "norm S": lambda a, b, c, p: torch.linalg.vector_norm(a), "norm R": lambda a, b, c, p: torch.linalg.vector_norm(b),
    "norm P": lambda a, b, c, p: torch.linalg.vector_norm(p),
    "norm inf": lambda a, b, c, p: torch.linalg.vector_norm(a, float("inf")), "amax": lambda a, b, c, p: a.amax(),
    "t": lambda a, b, c, p: a.t(), "mm S0 R": lambda a, b, c, p: a @ c, "mm R S1": lambda a, b, c, p: b @ _s1(c),
    "mm S1 S0": lambda a, b, c, p: _s1(b) @ _s0(c), "mm S0 S0": lambda a, b, c, p: a @ _s0(c),
    "mm P R": lambda a, b, c, p: p @ c, "addmm S1 S0": lambda a, b, c, p: torch.addmm(c[0], _s1(b), _s0(c)),
    "linear S0 W": lambda a, b, c, p: torch.nn.functional.linear(b, _s0(c.t().contiguous()), _s0(c[0])),
    "view flatten": lambda a, b, c, p: a.view(-1), "view split": lambda a, b, c, p: a.view(2, 2, 6),
    "view inner": lambda a, b, c, p: a.view(4, 2, 3), "view S1 split": lambda a, b, c, p: _s1(a).view(4, 2, 3),
    "reshape merge": lambda a, b, c, p: a.reshape(8, 3), "unsqueeze": lambda a, b, c, p: a.unsqueeze(0),
    "transpose": lambda a, b, c, p: a.unsqueeze(0).transpose(0, 2), "clone P": lambda a, b, c, p: p.clone(),
    "detach": lambda a, b, c, p: a.detach(), "zeros_like P": lambda a, b, c, p: torch.zeros_like(p),
    "empty_like": lambda a, b, c, p: torch.empty_like(a).zero_(), "stack": lambda a, b, c, p: torch.stack([a, a]),
    "mul_": lambda a, b, c, p: a.mul_(b), "add_ alpha": lambda a, b, c, p: a.add_(b, alpha=-0.5),
    "addcmul_": lambda a, b, c, p: a.addcmul_(b, b, value=0.1), "addcdiv_": lambda a, b, c, p: a.addcdiv_(
        b, b.abs() + 1, value=-0.1), "lerp_": lambda a, b, c, p: a.lerp_(b, 0.1),
    "copy_ R->S": lambda a, b, c, p: a.copy_(b), "zero_": lambda a, b, c, p: a.zero_(),
    "fill_": lambda a, b, c, p: a.fill_(3.0), "add_ P P": lambda a, b, c, p: p.add_(p),
    "item": lambda a, b, c, p: torch.tensor(b.sum().item()),  # (of a Partial: ours reduces, torch's reads the term)
}
# where torch's layout is one pt_dist does not have (a _StridedShard; a norm kept partial through stack), ours is
# Replicate and the values are the same
_OURS_REPLICATE = {
    "view S1 flatten": lambda a, b, c, p: _s1(a).reshape(-1),
    "stack norms": lambda a, b, c, p: torch.stack([torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)]),
}


def _ops(rank, world, backend):
    _both_worlds(rank, world, backend)
    try:
        mesh, tmesh = _meshes((world,))
        x, y, w = _rank_tensor(0, (4, 6)), _rank_tensor(0, (4, 6), 1), _rank_tensor(0, (6, 5), 2)
        local = _rank_tensor(rank, (4, 6), 3)
        out = {}
        for name, fn in {**_OPS, **_OURS_REPLICATE}.items():
            res = []
            for api, m, S, R, P, distribute in ((DTensor, mesh, Shard, Replicate, Partial, distribute_tensor),
                                                (tt.DTensor, tmesh, tt.Shard, tt.Replicate, tt.Partial,
                                                 tt.distribute_tensor)):
                # fresh copies: a Replicate or Partial DTensor shares its source's storage, and in-place ops write
                args = (distribute(x.clone(), m, [S(0)]), distribute(y.clone(), m, [R()]),
                        distribute(w.clone(), m, [R()]), api.from_local(local.clone(), m, [P()]))
                r = fn(*args)
                res.append((str(r.placements), r.full_tensor().float()) if isinstance(r, api)
                           else ("plain", r.float()))
            out[name] = res
        return out
    finally:
        _close_up()


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_op_placements_and_values_match_torchs(backend):
    for out in run_ranks(_ops, 2, backend, backend=None, timeout=120):
        assert len(out) == len(_OPS) + len(_OURS_REPLICATE)
        for name, ((ours, got), (theirs, want)) in out.items():
            if name in _OURS_REPLICATE:
                assert ours == "(Replicate(),)" and theirs != ours, (name, theirs)
            else:
                assert ours == theirs, (name, ours, theirs)
            tol = 1e-2 if "bf16" in name else 1e-5
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=name)


# -- a tensor-parallel MLP and the single-tensor optimizers on DTensor parameters (torch's
# test/distributed/tensor/parallel/test_tp_examples.py's MLP, test_optimizers.py, test_utils' clip_grad_norm_) ------
_OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.05, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, foreach=False),
}


def _mlp_params():
    g = torch.Generator().manual_seed(5)
    return [torch.randn(8, 4, generator=g), torch.randn(8, generator=g), torch.randn(3, 8, generator=g)]


def _train(step_fn, params, make_opt, steps=2):
    """Per step: loss, gradients (whole), the clipped norm; then the parameters (whole)."""
    opt, out = make_opt(params), []
    for i in range(steps):
        opt.zero_grad()
        loss, extra = step_fn(i)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        whole = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone() for p in params]
        layouts = [str(getattr(p.grad, "placements", "")) for p in params]
        out.append((loss.item(), whole, norm.full_tensor() if hasattr(norm, "full_tensor") else norm, extra, layouts))
        opt.step()
    return out, [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in params]


def _tp_mlp(rank, world, backend):
    """Colwise first layer (weight and bias Shard(0): the activations Shard on their last dim), rowwise second
    (weight Shard(1): the output Partial, all-reduced), on a [2, 5, 4] input (matmul's view -> mm -> view)."""
    import torch.nn.functional as F

    _both_worlds(rank, world, backend)
    try:
        mesh, tmesh = _meshes((world,))
        x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(9))
        results = {}
        for name, make_opt in _OPTIMIZERS.items():
            runs = []
            for api, m, S, R, distribute in ((DTensor, mesh, Shard, Replicate, distribute_tensor),
                                             (tt.DTensor, tmesh, tt.Shard, tt.Replicate, tt.distribute_tensor)):
                ps = [torch.nn.Parameter(distribute(t, m, [pl])) for t, pl in zip(_mlp_params(), [S(0), S(0), S(1)])]
                xs = []

                def step(i, api=api, m=m, R=R, ps=ps, xs=xs):
                    xl = (x * (i + 1)).requires_grad_()
                    xs.append(xl)
                    h = torch.relu(F.linear(api.from_local(xl, m, [R()]), ps[0], ps[1]))
                    o = F.linear(h, ps[2])
                    loss = o.redistribute(m, [R()]).to_local().square().mean()
                    return loss, (str(h.placements), str(o.placements))

                steps, final = _train(step, ps, make_opt)
                runs.append((steps, final, [str(p.placements) for p in ps], [xl.grad for xl in xs]))
            plain = [torch.nn.Parameter(t) for t in _mlp_params()]
            steps, final = _train(lambda i, ps=plain: (F.linear(torch.relu(F.linear(x * (i + 1), ps[0], ps[1])),
                                                                ps[2]).square().mean(), None), plain, make_opt)
            runs.append((steps, final, None, None))
            results[name] = runs
        return results
    finally:
        _close_up()


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_tp_mlp_and_optimizers_match_torchs_dtensor_and_the_plain_model(backend):
    for results in run_ranks(_tp_mlp, 2, backend, backend=None, timeout=180):
        assert sorted(results) == sorted(_OPTIMIZERS)
        for name, (ours, theirs, plain) in results.items():
            assert ours[2] == theirs[2] == ["(Shard(dim=0),)", "(Shard(dim=0),)", "(Shard(dim=1),)"], name
            for i, (o, t, p) in enumerate(zip(ours[0], theirs[0], plain[0])):
                assert o[3] == t[3] == ("(Shard(dim=2),)", "(Partial(sum),)"), (name, i)
                assert o[4] == t[4] == ours[2], (name, i)  # gradients laid out as their parameters
                assert o[0] == pytest.approx(t[0], rel=1e-6) and o[0] == pytest.approx(p[0], rel=1e-5), (name, i)
                for a, b, c in zip(o[1], t[1], p[1]):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} step {i} vs torch")
                    torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5, msg=f"{name} step {i} vs plain")
                torch.testing.assert_close(o[2], t[2], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(o[2], p[2], rtol=1e-4, atol=1e-5)
            for a, b in zip(ours[3], theirs[3]):  # the input's gradient through from_local(Replicate)
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            for a, b, c in zip(ours[1], theirs[1], plain[1]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} parameters vs torch")
                torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5, msg=f"{name} parameters vs plain")
            assert not torch.equal(ours[1][0], _mlp_params()[0])  # the step moved the parameters
