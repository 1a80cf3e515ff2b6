"""In-place random fills (torch's ``tensor/_ops/_random_ops.py``): each rank fills its local shard, placements kept.

On a CPU mesh torch keeps no offset-based RNG tracker (``tensor/_random.py`` supports accelerator meshes only), so
its ``normal_`` / ``uniform_`` / ... draw each shard from the rank's own generator; the same here, so that a
``reset_parameters`` after ``fully_shard`` gives torch's shards. A Partial ``self`` has no meaning to fill."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule

aten = torch.ops.aten
RANDOM_OPS = [getattr(aten, n) for n in ("normal_", "uniform_", "bernoulli_", "exponential_", "geometric_",
                                          "log_normal_", "cauchy_", "random_") if hasattr(aten, n)]


@register_prop_rule(RANDOM_OPS)
def random_fill_rule(call: OpCall) -> OutputSharding:
    (spec, *others) = call.specs
    if any(p.is_partial() for p in spec.placements):
        raise RuntimeError(f"{call.op}: cannot fill a Partial DTensor ({spec.placements}); redistribute it first")
    return OutputSharding([spec.placements, *[None] * len(others)], spec.placements)
