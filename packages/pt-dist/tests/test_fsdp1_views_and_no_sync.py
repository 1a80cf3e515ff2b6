"""FSDP1 cases from torch's test/distributed/fsdp/ rewritten for pt_dist and run beside torch's FSDP1 in the same
2 ranks: the wrapped module keeps its original parameter names reachable after wrapping (torch's
``FlatParamHandle`` leaves each as a plain-tensor view of the unit's unsharded flat parameter;
test_fsdp_summon_full_params.py's ``test_summon_full_param_recursive`` and ``test_params_are_unflattenned`` read
them), full-valued inside
``summon_full_params`` and forward; and test_fsdp_no_sync.py's / test_fsdp_grad_acc.py's pattern: inside
``no_sync()`` a parameter's ``.grad`` is this rank's own, unreduced gradient (``NO_SHARD``; and with the sharded
strategies the unsharded gradient torch's ``_post_backward_hook`` leaves in ``flat_param.grad``), and the next
synced backward reduces it with its own."""

from __future__ import annotations

import contextlib
import itertools
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


# -- no_sync() with the sharded strategies (torch's _runtime_utils._post_backward_hook, _flat_param's
# prepare_gradient_for_backward / _use_unsharded_grad_views; test_fsdp_grad_acc.py's interleaving) ------------------

_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")


def _two_units(fsdp_cls, kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))
    model[2] = fsdp_cls(model[2], **kw)
    return fsdp_cls(model, **kw)


def _x(rank, i):
    return torch.randn(6, 5, generator=torch.Generator().manual_seed(10 * i + rank))


def _reads_around_no_sync(fsdp_cls, model, rank):
    """Synced, no_sync twice, synced (no zero_grad between, as test_fsdp_grad_acc's interleaving), an SGD step;
    zero_grad, no_sync, zero_grad inside (which drops what it kept), no_sync, synced, a step. After every
    backward: each parameter's name, shape and gradient as a user reads them; then the full parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reads = []
    for i, sync in enumerate((True, False, False, True, None, False, False, True)):
        if sync is None:
            opt.step()
            opt.zero_grad()
            continue
        with contextlib.nullcontext() if sync else model.no_sync():
            if i == 6:
                model.zero_grad()
            model(_x(rank, i)).pow(2).sum().backward()
        reads.append([(n, tuple(p.shape), None if p.grad is None else (tuple(p.grad.shape), p.grad.detach().clone()))
                      for n, p in model.named_parameters()])
    opt.step()
    with fsdp_cls.summon_full_params(model):
        return reads, [p.detach().clone() for p in model.parameters()]


def _no_sync_sharded(rank, world):
    import pt_dist.fsdp as ours
    import torch.distributed.fsdp as theirs
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    _both_worlds(rank, world, "gloo")
    try:
        names = ("replicate", "shard")
        meshes = (init_device_mesh("cpu", (1, 2), mesh_dim_names=names),
                  torch_init_device_mesh("cpu", (1, 2), mesh_dim_names=names))
        out = {}
        for strategy, orig in itertools.product(_STRATEGIES, (False, True)):
            sides = []
            for lib, mesh, extra in ((ours, meshes[0], {}), (theirs, meshes[1], {"device_id": torch.device("cpu")})):
                kw = {"sharding_strategy": getattr(lib.ShardingStrategy, strategy), "use_orig_params": orig, **extra}
                if strategy == "HYBRID_SHARD":
                    kw["device_mesh"] = mesh
                cls = lib.FullyShardedDataParallel
                sides.append(_reads_around_no_sync(cls, _two_units(cls, kw), rank))
            out[strategy, orig] = sides
        torch.manual_seed(0)
        local = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))
        local(_x(rank, 1)).pow(2).sum().backward()
        return out, [p.grad for p in local.parameters()]
    finally:
        leave()  # (pt_dist's gloo adapter made torch's default group: leaving destroys both)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_sharded_no_sync_keeps_the_unsharded_gradient_in_grad_as_torch():
    """Inside ``no_sync()`` torch's FSDP1 leaves each unit's unreduced, unsharded gradient in ``flat_param.grad``
    (on the shard-sized parameter; with ``use_orig_params`` each original's ``.grad`` is its whole gradient in its
    own shape), a synced shard found there set aside; the next synced backward reduce-scatters the sum and adds the
    shard back; ``zero_grad()`` inside drops what was kept. pt_dist's reads equal torch's after every backward,
    and so do the parameters after the steps, for FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD, flat and original."""
    results = run_ranks(_no_sync_sharded, 2, backend=None, timeout=240)
    for rank, (out, local) in enumerate(results):
        for (strategy, orig), ((reads, params), (t_reads, t_params)) in out.items():
            what = f"rank {rank} {strategy} use_orig_params={orig}"
            assert len(reads) == len(t_reads) == 7, what
            for i, (read, t_read) in enumerate(zip(reads, t_reads)):
                assert [r[:2] for r in read] == [r[:2] for r in t_read], (what, i)
                for (name, _, g), (_, _, t_g) in zip(read, t_read):
                    assert (g is None) == (t_g is None), (what, i, name, g, t_g)
                    if g is not None:
                        assert g[0] == t_g[0], (what, i, name, g[0], t_g[0])
                        assert torch.allclose(g[1], t_g[1], rtol=1e-5, atol=1e-6), (what, i, name)
            assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, t_params)), what
            # after the first no_sync backward: this rank's own gradient of that batch alone, whole
            kept = [g for _, _, g in reads[1]]
            if orig:
                assert [k[0] for k in kept] == [tuple(g.shape) for g in local], what
                assert all(torch.allclose(k[1], g, rtol=1e-5, atol=1e-6) for k, g in zip(kept, local)), what
            else:  # flat: the root's unit holds layer 0's gradient unsharded (5 * 3 + 3 elements)
                assert kept[0][0] == (18,) and torch.allclose(
                    kept[0][1], torch.cat([local[0].reshape(-1), local[1]]), rtol=1e-5, atol=1e-6), what
    assert not torch.allclose(results[0][1][0], results[1][1][0])  # each rank's own gradient: the check can fail
