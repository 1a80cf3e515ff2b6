"""pt-dist's tcp and shm as torch.distributed backends (``pt_tcp``, ``pt_shm``: _compat/torch_backend.py).

torch's own DistributedDataParallel, FSDP (FSDP1), DistributedSampler and collectives run on a default group of
``pt_shm`` / ``pt_tcp`` made by torch's ``init_process_group``; in the same ranks a gloo group runs the same work,
and every result, loss and gradient must be bitwise the same. And the reverse road (issue 34, defect 4): after
``pt_dist.init_process_group("tcp" | "shm")``, torch's utilities that ask ``torch.distributed`` for the world see
pt-dist's world group (they raised "Default process group has not been initialized")."""

from __future__ import annotations

import copy
import datetime

import pt_dist
import pytest
import torch
import torch.distributed as dist
from torch import nn

import harness
from harness import run_ranks

BACKENDS = ["pt_shm", "pt_tcp"]


def _torch_init(rank, world_size, backend):
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        harness.store().set("tb_port", str(store.port))
    else:
        store = dist.TCPStore("127.0.0.1", int(harness.store().get("tb_port")), world_size,
                              timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    return dist.new_group(backend="gloo")


def _collectives(rank, world_size, backend):
    gloo = _torch_init(rank, world_size, backend)
    try:
        assert dist.get_backend() == backend and dist.get_rank() == rank and dist.get_world_size() == world_size
        out = {}

        def both(name, fn):
            out[name] = [fn(None), fn(gloo)]

        x = torch.arange(6.0) + rank
        both("all_reduce", lambda g: (lambda t: (dist.all_reduce(t, group=g), t)[1])(x.clone()))
        both("all_reduce max", lambda g: (lambda t: (dist.all_reduce(t, dist.ReduceOp.MAX, group=g), t)[1])(x.clone()))
        both("broadcast", lambda g: (lambda t: (dist.broadcast(t, 1, group=g), t)[1])(x.clone()))
        # (reduce: off the root torch's gloo leaves partial sums, undefined by torch's docs: only the root's compared)
        both("reduce", lambda g: (lambda t: (dist.reduce(t, 0, group=g), t if rank == 0 else None)[1])(x.clone()))
        both("all_gather", lambda g: (lambda o: (dist.all_gather(o, x, group=g), o)[1])(
            [torch.zeros(6) for _ in range(world_size)]))
        both("all_gather_into_tensor", lambda g: (lambda o: (dist.all_gather_into_tensor(o, x, group=g), o)[1])(
            torch.zeros(6 * world_size)))
        both("reduce_scatter_tensor", lambda g: (lambda o: (dist.reduce_scatter_tensor(
            o, torch.arange(4.0 * world_size) * (rank + 1), group=g), o)[1])(torch.zeros(4)))
        both("reduce_scatter", lambda g: (lambda o: (dist.reduce_scatter(
            o, [torch.full((3,), float(rank + j)) for j in range(world_size)], group=g), o)[1])(torch.zeros(3)))
        splits = [1 + j for j in range(world_size)]  # uneven rows
        both("all_to_all_single", lambda g: (lambda o: (dist.all_to_all_single(
            o, torch.arange(float(sum(splits))) + 10 * rank, [1 + rank] * world_size, splits, group=g), o)[1])(
            torch.zeros((1 + rank) * world_size)))
        both("all_to_all", lambda g: (lambda o: (dist.all_to_all(
            o, [torch.full((2,), float(10 * rank + j)) for j in range(world_size)], group=g), o)[1])(
            [torch.zeros(2) for _ in range(world_size)]))
        both("gather", lambda g: (lambda o: (dist.gather(x, o, dst=0, group=g), o)[1])(
            [torch.zeros(6) for _ in range(world_size)] if rank == 0 else None))
        both("scatter", lambda g: (lambda o: (dist.scatter(
            o, [torch.full((6,), float(j)) for j in range(world_size)] if rank == 1 else None, src=1, group=g),
            o)[1])(torch.zeros(6)))
        both("all_reduce_coalesced", lambda g: (lambda ts: (dist.all_reduce_coalesced(ts, group=g), ts)[1])(
            [torch.ones(3) * (rank + 1), torch.ones(2, 2) * (rank + 2)]))
        both("barrier", lambda g: dist.barrier(group=g))
        both("all_gather_object", lambda g: (lambda o: (dist.all_gather_object(o, {"rank": rank}, group=g), o)[1])(
            [None] * world_size))
        got = torch.zeros(3)  # point to point; rank 0's answer comes through a receive from any rank
        if rank == 0:
            dist.send(torch.arange(3.0), 1)
            dist.irecv(got).wait()
        else:
            dist.recv(got, 0)
            dist.send(got * 2, 0)
        out["p2p"] = [got, torch.arange(3.0) * (2 if rank == 0 else 1)]
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchs_collectives_on_pt_backends_equal_gloos(backend):
    for rank, out in enumerate(run_ranks(_collectives, 2, backend, backend=None, timeout=120)):
        for name, (ours, gloos) in out.items():
            assert type(ours) is type(gloos), name
            if isinstance(ours, torch.Tensor):
                assert torch.equal(ours, gloos), (rank, name, ours, gloos)
            elif isinstance(ours, list) and ours and isinstance(ours[0], torch.Tensor):
                assert all(torch.equal(a, b) for a, b in zip(ours, gloos)), (rank, name, ours, gloos)
            else:
                assert ours == gloos, (rank, name)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 8), nn.ReLU(), nn.Linear(8, 4))


def _train(rank, world_size, backend, kind):
    gloo = _torch_init(rank, world_size, backend)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def wrap(m, g):
            if kind == "ddp":
                return nn.parallel.DistributedDataParallel(m, process_group=g, bucket_cap_mb=0.001)
            return FSDP(m, process_group=g, use_orig_params=True, device_id=torch.device("cpu"))
        base = _model()
        models = [wrap(copy.deepcopy(base), None), wrap(copy.deepcopy(base), gloo)]
        opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
        steps = []
        for step in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * rank + step))
            row = []
            for m, opt in zip(models, opts):
                opt.zero_grad()
                loss = m(x).square().mean()
                loss.backward()
                # (None: FSDP's use_orig_params leaves a parameter with no elements in this rank's shard without one)
                row.append((loss.item(), [None if p.grad is None else p.grad.clone() for p in m.parameters()]))
                opt.step()
            steps.append(row)
        return steps
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_torchs_ddp_and_fsdp_on_pt_backends_train_as_on_gloo(backend, kind):
    """torch's own DistributedDataParallel (small buckets, so several all-reduces overlap backward) and FSDP1
    (all-gather, reduce-scatter), on the pt default group and on gloo: every loss and gradient bitwise equal."""
    for steps in run_ranks(_train, 2, backend, kind, backend=None, timeout=180):
        for (l_ours, g_ours), (l_gloo, g_gloo) in steps:
            assert l_ours == l_gloo
            assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(g_ours, g_gloo))


def _world_for_torch(rank, world_size, backend, port_key):
    from pt_dist._infra.store import TCPStore
    from torch.utils.data import DistributedSampler

    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=30)
        harness.store().set(port_key, str(store.port))
    else:
        store = TCPStore("127.0.0.1", int(harness.store().get(port_key)), world_size, timeout=30)
    pt_dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=30)
    t = torch.ones(3)
    dist.all_reduce(t)  # torch's call, pt-dist's world group
    sampler = list(DistributedSampler(range(6), shuffle=False))
    later = []  # groups torch makes on the shared world meet through pt-dist's store (gloo's too)
    for kind in ("gloo", f"pt_{backend}"):
        u = torch.full((2,), float(rank + 1))
        dist.all_reduce(u, group=dist.new_group(backend=kind))
        later.append(u.tolist())
    seen = (dist.get_rank(), dist.get_world_size(), dist.get_backend(), sampler, t.tolist(), later)
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    return seen, dist.is_initialized()


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_torch_utilities_see_pt_dists_world(backend):
    """Issue 34, defect 4: DistributedSampler() with no arguments and torch.distributed.get_rank() after
    pt_dist.init_process_group raised 'Default process group has not been initialized'."""
    results = run_ranks(_world_for_torch, 2, backend, f"tw_{backend}", backend=None, timeout=60)
    for rank, (seen, still) in enumerate(results):
        assert seen == (rank, 2, f"pt_{backend}", [rank, rank + 2, rank + 4], [2.0] * 3, [[3.0, 3.0]] * 2)
        assert not still  # pt_dist.destroy_process_group took torch's view of it down too
