"""The Reducer's mechanisms one at a time: bucket assignment (against torch's own function), communication that
overlaps backward, the unused-parameter error, the construction checks and broadcast, argument errors."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed as dist
from pt_dist.nn.parallel.bucketing import _compute_bucket_assignment_by_size
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def test_bucket_assignment_matches_torchs_on_random_parameter_lists():
    rng = random.Random(0)
    dtypes = [torch.float32, torch.float64, torch.float16]
    for trial in range(200):
        tensors = [torch.empty(rng.randint(0, 300), dtype=rng.choice(dtypes)) for _ in range(rng.randint(1, 12))]
        limits = [rng.randint(1, 600) for _ in range(rng.randint(1, 3))]
        assert _compute_bucket_assignment_by_size(tensors, limits) == \
            tuple(dist._compute_bucket_assignment_by_size(tensors, limits)), (trial, limits)
        # tensors in a given order (a rebuild's), labelled with their indices; torch emits the buckets still open at
        # the end in its hash map's order, so those are compared as a set
        order = list(range(len(tensors)))
        rng.shuffle(order)
        walked = [tensors[i] for i in order]
        ours = _compute_bucket_assignment_by_size(walked, limits, tensor_indices=order)
        theirs = dist._compute_bucket_assignment_by_size(walked, limits, [False] * len(tensors), order)
        assert sorted(zip(*ours)) == sorted(zip(*theirs)), trial
        closed = [b for b, lim in zip(*ours) if sum(tensors[i].nbytes for i in b) >= lim]
        assert ours[0][:len(closed)] == theirs[0][:len(closed)], trial


class _SlowBackward(torch.autograd.Function):
    """Identity; its backward notes whether the later layer's bucket was launched and then finished while it slept."""

    @staticmethod
    def forward(ctx, x, probe):
        ctx.probe = probe
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.probe()
        return grad, None


def _overlap(rank, world, backend):
    util.join(rank, world, backend, timeout=30)
    try:
        torch.manual_seed(0)
        first, last = nn.Linear(256, 256), nn.Linear(256, 256)
        model = nn.ModuleDict({"first": first, "last": last})
        ddp = pt_dist.DistributedDataParallel(model, bucket_cap_mb=0.2)  # one bucket per layer
        seen = []

        def probe():  # runs between the two layers' gradients; backward waits here until the bucket is done
            bucket = ddp.reducer._buckets[0]
            launched = bucket.future is not None
            deadline = time.monotonic() + 10  # (a loaded machine can hold the peer back for seconds)
            while launched and not bucket.future.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append((launched, bucket.future is not None and bucket.future.done(),
                         first.weight.grad is None))

        def run(x):
            h = _SlowBackward.apply(first(x), probe)
            return last(h)
        ddp.module.forward = run
        for _ in range(2):  # before and after the rebuild
            model.zero_grad()
            ddp(torch.randn(8, 256)).sum().backward()
        return seen, [sorted(b.param_indices) for b in ddp.reducer._buckets]
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_a_full_buckets_all_reduce_runs_while_backward_goes_on(backend):
    """The last layer's bucket is all-reduced while the earlier layer's backward still runs: launched and finished
    before the first layer's gradient exists."""
    for seen, buckets in run_ranks(_overlap, 2, backend, backend=None, timeout=60):
        assert buckets == [[2, 3], [0, 1]]
        assert seen == [(True, True, True)] * 2, seen


def _unused_parameter(rank, world, backend):
    util.join(rank, world, backend, timeout=30)
    out = {}
    try:
        torch.manual_seed(0)
        model = nn.ModuleDict({"used": nn.Linear(4, 4), "spare": nn.Linear(4, 4)})
        ddp = pt_dist.DistributedDataParallel(model)

        def step(use_spare):
            y = model["used"](torch.ones(2, 4))
            if use_spare:
                y = model["spare"](y)
            ddp.module.forward = lambda: y
            ddp().sum().backward()

        for label, uses in (("every rank", lambda r: False), ("rank 1 only", lambda r: r == 0)):
            try:
                step(uses(rank))
                out[label] = "no error"
            except RuntimeError as e:
                out[label] = str(e)
        step(True)  # the group and the DDP go on: a full step afterwards
        out["after"] = model["spare"].weight.grad is not None
    finally:
        util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_an_unused_parameter_without_find_unused_parameters_is_an_error_naming_it_never_a_hang(backend):
    r0, r1 = run_ranks(_unused_parameter, 2, backend, backend=None, timeout=60)
    for out in (r0, r1):
        assert "spare.weight, spare.bias" in out["every rank"] and "find_unused_parameters=True" in out["every rank"]
        assert out["after"]
    # used on rank 0 only: rank 1 fails, rank 0 (which got every gradient) still finishes its step
    assert r0["rank 1 only"] == "no error" and "on rank 1" in r1["rank 1 only"]


def _construction(rank, world, backend):
    util.join(rank, world, backend, timeout=30)
    out = {}
    try:
        torch.manual_seed(rank)  # each rank initialises differently: the construction broadcasts rank 0's
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        with torch.no_grad():
            model[1].running_mean.fill_(rank + 1)
        pt_dist.DistributedDataParallel(model)
        out["weights"] = model[0].weight.detach().clone()
        out["running_mean"] = model[1].running_mean.tolist()
        wrong = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5 if rank == 0 else 6))
        with pytest.raises(RuntimeError) as e:
            pt_dist.DistributedDataParallel(wrong)
        out["mismatch"] = str(e.value)
        for bad, error in ((dict(bucket_cap_mb=0), ValueError), (dict(dim=1), ValueError),
                           (dict(device_ids=[0]), ValueError)):
            with pytest.raises(error):
                pt_dist.DistributedDataParallel(nn.Linear(2, 2), **bad)
        with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
            pt_dist.DistributedDataParallel(nn.Linear(2, 2).requires_grad_(False))
        pt_dist.all_reduce(torch.ones(1))  # no rank was left inside a collective by the refusals
    finally:
        util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_construction_broadcasts_rank_0s_states_and_names_the_first_shape_mismatch_on_every_rank(backend):
    r0, r1 = run_ranks(_construction, 2, backend, backend=None, timeout=60)
    assert torch.equal(r0["weights"], r1["weights"])
    assert r0["running_mean"] == r1["running_mean"] == [1.0] * 4
    for out in (r0, r1):
        assert "#2 rank 1 has '1.weight' with shape (6, 4)" in out["mismatch"], out["mismatch"]
        assert "rank 0 has '1.weight' with shape (5, 4)" in out["mismatch"]
