"""FSDP1's ``device_mesh=`` (torch's DeviceMesh recipe builds HSDP this way): ``HYBRID_SHARD`` and
``_HYBRID_SHARD_ZERO2`` on a 2-D ``init_device_mesh`` shard within mesh dim 1 ("shard") and replicate across mesh
dim 0 ("replicate"), as torch's FSDP1 on torch's mesh in the same 4 ranks, after torch's
test/distributed/fsdp/test_fsdp_hybrid_shard.py (test_fsdp_hybrid_shard_basic_setup with a device mesh,
test_fsdp_hybrid_shard_parity): each rank's shard size, and the losses and parameters of three SGD steps on each
rank's own data equal torch's; a 1-D mesh is a plain strategy's group; bad combinations are named."""

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
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _train(fsdp_cls, strategy, mesh, rank, kw):
    model = fsdp_cls(_model(), device_mesh=mesh, sharding_strategy=strategy, **kw)
    shard = [p.numel() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * step + rank))
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with fsdp_cls.summon_full_params(model):
        params = [p.detach().clone() for p in model.parameters()]
    return shard, losses, params


def _hsdp(rank, world):
    import pt_dist.fsdp as ours
    import torch.distributed.fsdp as theirs
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    _both_worlds(rank, world, "tcp")
    try:
        names = ("replicate", "shard")
        mesh, tmesh = (init_device_mesh("cpu", (2, 2), mesh_dim_names=names),
                       torch_init_device_mesh("cpu", (2, 2), mesh_dim_names=names))
        out = {}
        for name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
            out[name] = (_train(ours.FullyShardedDataParallel, getattr(ours.ShardingStrategy, name), mesh, rank, {}),
                         _train(theirs.FullyShardedDataParallel, getattr(theirs.ShardingStrategy, name), tmesh, rank,
                                {"device_id": torch.device("cpu")}))
        errors = []
        for kwargs in ({"device_mesh": mesh, "process_group": dist.group.WORLD},
                       {"device_mesh": mesh, "sharding_strategy": ours.ShardingStrategy.FULL_SHARD},
                       {"device_mesh": mesh["shard"], "sharding_strategy": ours.ShardingStrategy.HYBRID_SHARD}):
            try:
                ours.FullyShardedDataParallel(_model(), **kwargs)
            except ValueError as e:
                errors.append(str(e))
        flat = ours.FullyShardedDataParallel(_model(), device_mesh=mesh["shard"])
        return out, errors, next(flat.parameters()).numel()
    finally:
        leave()
        dist.destroy_process_group()


def test_hybrid_shard_on_a_device_mesh_trains_as_torchs_on_4_ranks():
    results = run_ranks(_hsdp, 4, backend=None, timeout=240)
    numel = sum(p.numel() for p in _model().parameters())
    for rank, (out, errors, flat_numel) in enumerate(results):
        for name, ((shard, losses, params), (t_shard, t_losses, t_params)) in out.items():
            assert shard == t_shard == [-(-numel // 2)], (name, shard, t_shard)  # halves: sharded in pairs
            assert torch.allclose(torch.tensor(losses), torch.tensor(t_losses), rtol=1e-5), (name, rank)
            assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, t_params)), (name, rank)
        assert len(errors) == 3 and "Cannot pass both" in errors[0] and "2-D device_mesh" in errors[2], errors
        assert flat_numel == -(-numel // 2)
    # ranks 0 and 2 (one replicate group) end with the same parameters from different data
    assert torch.equal(results[0][0]["HYBRID_SHARD"][0][2][0], results[2][0]["HYBRID_SHARD"][0][2][0])
    assert results[0][0]["HYBRID_SHARD"][0][1] != results[2][0]["HYBRID_SHARD"][0][1]  # different data per rank
