"""``bmm`` (torch's ``tensor/_ops/_matrix_ops.py``): the core's ``mm`` table one dim further in (every Shard of
it moves up by one), plus the batch-sharded row ``Shard(0) @ Shard(0) -> Shard(0)``."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops._matrix_ops import _matmul_rule, _mm_choices
from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Shard

aten = torch.ops.aten


def _bmm_choices(a, b):
    def inward(p):
        return Shard(p.dim + 1) if isinstance(p, Shard) else p

    return [(Shard(0), Shard(0), Shard(0))] + [tuple(inward(p) for p in c) for c in _mm_choices(a, b)]


@register_prop_rule([aten.bmm])
def bmm_rule(call: OpCall) -> OutputSharding:
    return _matmul_rule(call, _bmm_choices)
