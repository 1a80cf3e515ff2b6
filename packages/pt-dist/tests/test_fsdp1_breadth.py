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
