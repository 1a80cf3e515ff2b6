"""FSDP1's surface beside torch's FSDP1 in the same 2 ranks: ``wrap.CustomPolicy`` (which submodules become units
and with which arguments of their own, after torch's test/distributed/fsdp/test_wrap.py ``test_custom_policy``),
``check_is_root``, and ``sharded_grad_scaler.ShardedGradScaler`` (test_fsdp_sharded_grad_scaler.py's pattern: a
step whose gradients hold an inf on one rank only is skipped on every rank and the scale backs off on both),
each compared by units, scales, losses and the trained parameters."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import leave  # noqa: E402
from test_device_mesh import _both_worlds  # noqa: E402


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 6)), nn.Linear(6, 3))


def _x(rank, i):
    return torch.randn(4, 4, generator=torch.Generator().manual_seed(10 * i + rank))


def _custom(lib, wrap, kw):
    def fn(m):
        if isinstance(m, nn.Linear) and m.out_features == 5:
            return {"sharding_strategy": lib.ShardingStrategy.NO_SHARD}
        return isinstance(m, nn.Linear) and m.out_features == 6

    fsdp = lib.FullyShardedDataParallel
    model = fsdp(_model(), auto_wrap_policy=wrap.CustomPolicy(fn), **kw)
    units = [(n, m.sharding_strategy.name) for n, m in model.named_modules() if isinstance(m, fsdp)]
    inner = next(m for n, m in model.named_modules() if isinstance(m, fsdp) and n)
    roots = (model.check_is_root(), inner.check_is_root())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(_x(dist.get_rank(), 0)).sum().backward()
    opt.step()
    with fsdp.summon_full_params(model):
        params = [p.detach().clone() for p in model.parameters()]
    try:
        fsdp(_model(), auto_wrap_policy=wrap.CustomPolicy(lambda m: 3), **kw)
        bad = None
    except ValueError as e:
        bad = str(e)
    return units, roots, params, bad


def _scaled(lib, scaler_cls, kw, rank):
    fsdp = lib.FullyShardedDataParallel
    model = fsdp(_model(), **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = scaler_cls("cpu", init_scale=2.0**8, growth_interval=2)
    scales, losses = [], []
    for i in range(4):
        x = _x(rank, i)
        if i == 1 and rank == 1:
            x[0, 0] = float("inf")  # this rank's gradients overflow
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(float(scaler.get_scale()))
        losses.append(loss.item())
    with fsdp.summon_full_params(model):
        return scales, losses, [p.detach().clone() for p in model.parameters()]


def _both(rank, world):
    import pt_dist.fsdp as ours
    import pt_dist.fsdp.wrap as our_wrap
    import torch.distributed.fsdp as theirs
    import torch.distributed.fsdp.wrap as their_wrap
    from pt_dist.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

    _both_worlds(rank, world, "tcp")
    try:
        cpu = {"device_id": torch.device("cpu")}
        return {"custom": (_custom(ours, our_wrap, {}), _custom(theirs, their_wrap, cpu)),
                "scaler": (_scaled(ours, ShardedGradScaler, {}, rank),
                           _scaled(theirs, TorchShardedGradScaler, cpu, rank))}
    finally:
        leave()
        dist.destroy_process_group()


def test_custom_policy_check_is_root_and_sharded_grad_scaler_match_torch():
    for out in run_ranks(_both, 2, backend=None, timeout=180):
        (units, roots, params, bad), (t_units, t_roots, t_params, t_bad) = out["custom"]
        assert units == t_units and len(units) == 4, (units, t_units)  # the root, two 6-wide Linears, the 5-wide
        assert sorted(s for _, s in units) == ["FULL_SHARD"] * 3 + ["NO_SHARD"], units  # the dict's own strategy
        assert roots == t_roots == (True, False)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, t_params))
        assert bad is not None and t_bad is not None and "should return False/True or a kwarg dict" in bad
        (scales, losses, params), (t_scales, t_losses, t_params) = out["scaler"]
        assert scales == t_scales and scales[1] == 2.0**7, (scales, t_scales)  # the overflow backed off, everywhere
        assert losses[0] == t_losses[0] and torch.allclose(torch.tensor(losses[2:]), torch.tensor(t_losses[2:]))
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, t_params))


# -- FSDP.register_comm_hook (torch's test/distributed/fsdp/test_fsdp_comm_hooks.py: the default hooks equal no
# hook, a custom hook is what runs, low-precision hooks) ----------------------------------------------------------


def _hooked(lib, hooks, group, reduce_scatter, all_reduce, strategy, which, kw, rank):
    fsdp = lib.FullyShardedDataParallel
    model = _model()
    model[2] = fsdp(model[2], sharding_strategy=getattr(lib.ShardingStrategy, strategy), **kw)
    model = fsdp(model, sharding_strategy=getattr(lib.ShardingStrategy, strategy), **kw)
    no_shard = strategy == "NO_SHARD"
    if which == "default":
        model.register_comm_hook(hooks.DefaultState(group), hooks.allreduce_hook if no_shard
                                 else hooks.reduce_scatter_hook)
    elif which == "fp16":
        model.register_comm_hook(hooks.LowPrecisionState(group), hooks.fp16_compress_hook)
    elif which == "sum":  # a user's hook: summed, not averaged
        model.register_comm_hook(group, (lambda g, grad: all_reduce(grad, group=g)) if no_shard
                                 else (lambda g, grad, out: reduce_scatter(out, grad, group=g)))
    errors = []
    if which != "none":
        try:
            model.register_comm_hook(None, lambda *a: None)
        except AssertionError as e:
            errors.append(str(e))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for i in range(2):
        model(_x(rank, i)).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    with fsdp.summon_full_params(model):
        return grads, [p.detach().clone() for p in model.parameters()], errors


def _hooks_both(rank, world):
    import pt_dist
    import pt_dist.algorithms._comm_hooks.default_hooks as our_hooks
    import pt_dist.fsdp as ours
    import torch.distributed.algorithms._comm_hooks.default_hooks as their_hooks
    import torch.distributed.fsdp as theirs

    _both_worlds(rank, world, "tcp")
    try:
        out = {}
        for strategy in ("FULL_SHARD", "NO_SHARD"):
            for which in ("none", "default", "sum", "fp16"):
                ours_run = _hooked(ours, our_hooks, pt_dist.group.WORLD, pt_dist.reduce_scatter_tensor,
                                   pt_dist.all_reduce, strategy, which, {}, rank)
                try:
                    theirs_run = _hooked(theirs, their_hooks, dist.group.WORLD, dist.reduce_scatter_tensor,
                                         dist.all_reduce, strategy, which, {"device_id": torch.device("cpu")}, rank)
                except RuntimeError as e:  # (torch's low-precision hooks call record_stream)
                    theirs_run = f"{type(e).__name__}: {e}"
                out[strategy, which] = (ours_run, theirs_run)
        return out
    finally:
        leave()
        dist.destroy_process_group()


def test_register_comm_hook_runs_the_hook_as_torchs_fsdp1():
    for out in run_ranks(_hooks_both, 2, backend=None, timeout=240):
        for strategy in ("FULL_SHARD", "NO_SHARD"):
            plain = out[strategy, "none"][0][0][0]  # ours without a hook: the first step's gradients
            for which in ("default", "sum", "fp16"):
                (grads, params, errors), theirs = out[strategy, which]
                what = f"{strategy} {which}"
                assert errors == ["A communication hook is already registered"], (what, errors)
                if isinstance(theirs, str):  # torch's low-precision hooks end in record_stream, which a CPU tensor
                    # refuses ("unknown parameter type"): ours against the unhooked run only
                    assert which == "fp16" and theirs.startswith("RuntimeError"), (what, theirs)
                else:
                    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(grads[0], theirs[0][0])), what
                    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, theirs[1])), what
                scale = 2.0 if which == "sum" else 1.0  # summed over 2 ranks instead of averaged
                tol = 2e-3 if which == "fp16" else 1e-6
                assert all(torch.allclose(a, scale * b, rtol=tol, atol=tol) for a, b in zip(grads[0], plain)), what
