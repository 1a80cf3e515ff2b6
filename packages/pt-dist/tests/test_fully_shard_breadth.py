"""FSDP2's ``FSDPModule`` setters beyond training's, beside torch's ``fully_shard`` in the same 2 ranks:
``set_all_reduce_hook`` (the user's hook on each reduced flat gradient, after the reduce-scatter, before the
post-division: torch's test/distributed/_composable/fsdp/test_fully_shard_comm.py ``test_set_all_reduce_hook``
pattern) and the deprecated ``set_reduce_scatter_divide_factor`` (with ``set_force_sum_reduction_for_comms``:
torch's gloo has no ``PREMUL_SUM``); gradients compared exactly."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_fully_shard_common import Compare, side_by_side, two_worlds  # noqa: E402


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _shard(model, fully_shard, mesh, **kw):
    fully_shard(model[0], mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)


def _setters(rank, world):
    cmp = Compare(f"rank {rank}")
    with two_worlds(rank, world, "fsb"):
        for what in ("hook", "divide"):
            theirs, ours = side_by_side(_mlp, _shard)
            calls = {"torch": 0, "ours": 0}
            caught = []
            for name, model in (("torch", theirs), ("ours", ours)):
                for m in (model, model[0]):
                    if what == "hook":
                        def hook(out, name=name, calls=calls):
                            calls[name] += 1
                            out.mul_(3.0)

                        m.set_all_reduce_hook(hook)
                    else:
                        with warnings.catch_warnings(record=True) as w:
                            warnings.simplefilter("always")
                            m.set_reduce_scatter_divide_factor(1.0)  # summed, not averaged
                        m.set_force_sum_reduction_for_comms(True)  # (torch's gloo has no PREMUL_SUM)
                        caught.append([type(x.message).__name__ for x in w])
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
            for model in (theirs, ours):
                model(x).sum().backward()
            cmp.grads(what, theirs, ours)
            cmp.eq(f"{what} calls", calls["torch"], calls["ours"])
            cmp.eq(f"{what} warnings", caught[:2], caught[2:])
            plain_t, plain_o = side_by_side(_mlp, _shard)
            for model in (plain_t, plain_o):
                model(x).sum().backward()
            factor = 3.0 if what == "hook" else 2.0  # the hook's scaling; a sum over 2 ranks, not a mean
            for p, q in zip(ours.parameters(), plain_o.parameters()):
                cmp.eq(f"{what}: x{factor} the plain gradient", True,
                       torch.allclose(p.grad.to_local(), factor * q.grad.to_local(), rtol=1e-5, atol=1e-6))
            if what == "hook":
                cmp.eq("hook called per group", calls["ours"], 2)
        return cmp.result()


def test_all_reduce_hook_and_divide_factor_alias_match_torchs_fully_shard():
    for fails, count in run_ranks(_setters, 2, backend=None, timeout=180):
        assert count > 10 and not fails, fails
