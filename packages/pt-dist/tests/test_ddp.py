"""DistributedDataParallel at world sizes 2 and 4 on tcp, shm and gloo: after every one of 5 steps the parameters
equal a single process trained on the whole batch and torch's own DistributedDataParallel trained alongside in
the same ranks. Several buckets and their rebuild, gradient_as_bucket_view with no_sync accumulation,
find_unused_parameters, static_graph, broadcast_buffers; tied, frozen and float64 parameters and a dict output
in every model; the construction checks and the unused-parameter error."""

from __future__ import annotations

import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import ptdist_testutil as util  # noqa: E402

TINY_BUCKETS = 0.00015  # MiB: 157 bytes, so the toy model's 8 gradients fill several buckets


def _order_of_readiness(ddp) -> list[int]:
    return list(ddp.reducer._rebuilt_order)


def _buckets_rebuilt(rank, world, torch_pg, checks):
    seen = {}

    def inspect(step, ddp):
        if step == 0:
            seen["initial"] = ddp.reducer._get_bucket_indices()
            seen["ready order"] = _order_of_readiness(ddp)
    ddp = dutil.train_side_by_side(rank, world, torch_pg, checks, "buckets", dutil.Toy, inspect=inspect,
                                   bucket_cap_mb=TINY_BUCKETS)
    seen["rebuilt"] = ddp.reducer._get_bucket_indices()
    seen["sizes"] = [b.buffer.numel() * b.buffer.element_size() for b in ddp.reducer._buckets]
    seen["dtypes"] = [str(b.buffer.dtype) for b in ddp.reducer._buckets]
    symmetric = getattr(pt_dist.group.WORLD, "symmetric", None)  # shm's symmetric heap
    offset = symmetric.offset if symmetric is not None else (lambda t: None)
    seen["symmetric"] = [offset(b.buffer) is not None for b in ddp.reducer._buckets]  # shm: buckets on the heap
    return seen


def _views_and_no_sync(rank, world, torch_pg, checks):
    views = []

    def inspect(step, ddp):  # after the synced backward: every .grad is its bucket's view
        for i, p in enumerate(ddp.reducer._params):
            bucket, k = ddp.reducer._locator[i]
            views.append(p.grad is not None and p.grad.data_ptr() == bucket.views[k].data_ptr())
    dutil.train_side_by_side(rank, world, torch_pg, checks, "view+no_sync", dutil.Toy, micro=3, inspect=inspect,
                             bucket_cap_mb=TINY_BUCKETS, gradient_as_bucket_view=True)
    return all(views) and len(views) == 5 * 8


def _find_unused(rank, world, torch_pg, checks):
    """Rank 0 runs branch a, the others branch b; ``never`` runs nowhere and keeps ``.grad`` None."""
    nones = []

    def inspect(step, ddp):
        nones.append([p.grad is None for p in ddp.module.never.parameters()])
    def branch_of(r):
        return "a" if r == 0 else "b"

    dutil.train_side_by_side(rank, world, torch_pg, checks, "find_unused", lambda: dutil.Toy(branches=True),
                             loss_fn=lambda m, x, y, r: dutil.toy_loss(m, x, y, r, branch_of), inspect=inspect,
                             bucket_cap_mb=TINY_BUCKETS, find_unused_parameters=True)
    return all(all(n) for n in nones) and len(nones) == 5


def _static(rank, world, torch_pg, checks):
    ddp = dutil.train_side_by_side(rank, world, torch_pg, checks, "static_graph", dutil.Toy,
                                   bucket_cap_mb=TINY_BUCKETS, static_graph=True)
    return ddp.reducer._has_rebuilt


def _buffers(rank, world, torch_pg, checks):
    """Batch-norm statistics differ by rank; both DDPs broadcast rank 0's before each forward."""
    def make():
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))

    def loss(m, x, y, r):
        return torch.nn.functional.mse_loss(m(x * (r + 1)), y)
    dutil.train_side_by_side(rank, world, torch_pg, checks, "broadcast_buffers", make, loss_fn=loss, single=False)
    return True


SCENARIOS = {"buckets": _buckets_rebuilt, "views": _views_and_no_sync, "unused": _find_unused, "static": _static,
             "buffers": _buffers}


def _parity(rank, world, backend, names):
    util.join(rank, world, backend, timeout=60)
    try:
        checks = util.Checks(f"rank {rank}")
        torch_pg = torch.distributed.group.WORLD  # harness's gloo group, or the gloo adapter's own
        info = {name: SCENARIOS[name](rank, world, torch_pg, checks) for name in names}
        return checks.fails, checks.count, info
    finally:
        util.leave()


def _run(backend, world, names):
    # torch's DDP needs torch's own group: the harness makes one for the native backends; the adapter is one
    return run_ranks(_parity, world, backend, names, backend=None if backend == "gloo" else "gloo", timeout=240)


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_ddp_matches_one_process_and_torch_ddp_at_world_2(backend):
    results = _run(backend, 2, list(SCENARIOS))
    for fails, count, info in results:
        assert not fails, fails[:5]
        # per step: 10 Toy parameters (16 with branches) against torch and one process; 6 + 3 buffers against torch
        assert count == 5 * (10 * 2 + 10 * 2 + 16 * 2 + 10 * 2 + 9), count
        assert info["views"] and info["unused"] and info["static"]
    buckets = [r[2]["buckets"] for r in results]
    assert len(buckets[0]["initial"]) >= 4, buckets[0]  # several buckets
    assert all(b["rebuilt"] == buckets[0]["rebuilt"] for b in buckets)  # rank 0's order on every rank
    order = buckets[0]["ready order"]
    assert sorted(order) == list(range(8)), order  # the 8 parameters that require grad, each once
    first = {i for b in buckets[0]["rebuilt"][:1] for i in b}
    assert order[0] in first  # the first gradient to arrive is in the first bucket after the rebuild
    assert {"torch.float32", "torch.float64"} == set(buckets[0]["dtypes"])
    assert buckets[0]["symmetric"] == [backend == "shm"] * len(buckets[0]["rebuilt"])


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_ddp_matches_one_process_and_torch_ddp_at_world_4(backend):
    for fails, count, _ in _run(backend, 4, ["buckets", "unused"]):
        assert not fails, fails[:5]
        assert count == 5 * 10 * 2 + 5 * 16 * 2
