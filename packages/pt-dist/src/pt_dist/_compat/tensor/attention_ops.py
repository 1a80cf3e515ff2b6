"""``scaled_dot_product_attention`` on DTensors (torch's ``tensor/_ops/_matrix_ops.py`` SDPA strategies, here
with CPU's flash kernel ``_scaled_dot_product_flash_attention_for_cpu`` and its backward, which torch's table
lacks). Attention is independent per batch row and per head, so q, k, v (and the gradients, output and
logsumexp) sharded alike on the batch dim (``Shard(0)``) or the head dim (``Shard(1)``) run locally, each rank its
rows or heads (tensor parallelism's attention: a ``ColwiseParallel`` q/k/v projection gives the heads sharded).
Any other layout is replicated first. A mask follows where its dim is not broadcast."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Replicate, Shard

aten = torch.ops.aten


def _common(call: OpCall, qkv: list, out_ndims: list[int]) -> OutputSharding:
    """Per mesh dim: the batch or head shard all of ``qkv`` (spec indices) share, else Replicate; every other
    tensor argument (a mask) cut to match where it is not broadcast."""
    specs = call.specs
    wants, outs = [[] for _ in specs], [[] for _ in out_ndims]
    for m in range(call.mesh_ndim):
        first = specs[qkv[0]].placements[m]
        shared = first if isinstance(first, Shard) and first.dim in (0, 1) and \
            all(specs[i].placements[m] == first for i in qkv) else Replicate()
        for i, s in enumerate(specs):
            d = shared.dim - (4 - s.ndim) if isinstance(shared, Shard) else -1
            keep = i in qkv or (d >= 0 and s.shape[d] == specs[qkv[0]].shape[shared.dim])
            wants[i].append(shared if i in qkv else Shard(d) if keep and d >= 0 else Replicate())
        for j, nd in enumerate(out_ndims):
            outs[j].append(shared if isinstance(shared, Shard) and shared.dim < nd else Replicate())
    return OutputSharding([tuple(w) for w in wants], [tuple(o) for o in outs])


@register_prop_rule([aten._scaled_dot_product_flash_attention_for_cpu])
def flash_cpu_rule(call: OpCall) -> OutputSharding:
    return _common(call, [0, 1, 2], [4, 3])  # (output, logsumexp)


@register_prop_rule([aten._scaled_dot_product_flash_attention_for_cpu_backward])
def flash_cpu_backward_rule(call: OpCall) -> OutputSharding:
    return _common(call, [0, 1, 2, 3, 4, 5], [4, 4, 4])  # grad_out, q, k, v, out, logsumexp -> dq, dk, dv


@register_prop_rule([aten._fused_sdp_choice])
def sdp_choice_rule(call: OpCall) -> OutputSharding:
    """Which kernel: read from the local shapes, the same on every rank (no layout change)."""
    return OutputSharding([None] * len(call.specs), None)
