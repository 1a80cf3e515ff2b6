"""FSDP1 cases from torch's test/distributed/fsdp/ rewritten for pt_dist and run beside torch's FSDP1 in the same
2 ranks: the wrapped module keeps its original parameter names reachable after wrapping (torch's
``FlatParamHandle`` leaves each as a plain-tensor view of the unit's unsharded flat parameter;
test_fsdp_summon_full_params.py's ``test_summon_full_param_recursive`` and ``test_params_are_unflattenned`` read
them), full-valued inside
``summon_full_params`` and forward; and test_fsdp_no_sync.py's pattern with ``NO_SHARD``: inside ``no_sync()`` a
parameter's ``.grad`` is this rank's own, unreduced gradient, and the next synced backward averages it in."""

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
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def _one_side(rank, fsdp_cls, strategy, kw):
    full = {n: p.detach().clone() for n, p in _model().named_parameters()}
    model = fsdp_cls(_model(), **kw)
    inner = model.module
    names = {f"{i}.{n}": (type(getattr(inner[i], n)).__name__, tuple(getattr(inner[i], n).shape))
             for i in (0, 2) for n in ("weight", "bias") if hasattr(inner[i], n)}
    with fsdp_cls.summon_full_params(model):
        summoned = all(torch.equal(getattr(inner[int(k[0])], k[2:]), v) for k, v in full.items())
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(rank))
    # NO_SHARD under no_sync: the flat parameter's .grad is this rank's own gradient
    model2 = fsdp_cls(_model(), sharding_strategy=strategy.NO_SHARD, **kw)
    with model2.no_sync():
        model2(x).sum().backward()
    kept = [None if p.grad is None else p.grad.clone() for p in model2.parameters()]
    model2(x * 2).sum().backward()
    synced = [p.grad.clone() for p in model2.parameters()]
    return names, summoned, kept, synced


def _both(rank, world):
    import pt_dist.fsdp as ours
    import torch.distributed.fsdp as theirs

    _both_worlds(rank, world, "tcp")
    try:
        got = _one_side(rank, ours.FullyShardedDataParallel, ours.ShardingStrategy, {})
        want = _one_side(rank, theirs.FullyShardedDataParallel, theirs.ShardingStrategy,
                         {"device_id": torch.device("cpu")})
        local = _model()
        local(torch.randn(5, 4, generator=torch.Generator().manual_seed(rank))).sum().backward()
        own = torch.cat([p.grad.reshape(-1) for p in local.parameters()])
        return got, want, own
    finally:
        leave()
        dist.destroy_process_group()


def test_names_stay_reachable_and_no_shard_no_sync_keeps_the_local_gradient_as_torch():
    results = run_ranks(_both, 2, backend=None, timeout=120)
    for got, want, own in results:
        (names, summoned, kept, synced), (t_names, t_summoned, t_kept, t_synced) = got, want
        assert names == t_names and names["0.weight"] == ("Tensor", (3, 4)) and len(names) == 4
        assert summoned and t_summoned
        assert len(kept) == len(t_kept) == 1 and t_kept[0] is not None
        assert kept[0] is not None and torch.allclose(kept[0], t_kept[0]) and torch.allclose(kept[0], own)
        assert torch.allclose(synced[0], t_synced[0])
    assert not torch.allclose(results[0][2], results[1][2])  # each rank's own gradient: the check can fail
