"""FSDP2's two collectives per parameter group (torch's torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):

- ``foreach_all_gather``: copy every parameter's padded shard into this rank's slot of one flat buffer and
  all-gather it in place (one collective for the group); ``foreach_all_gather_copy_out`` then splits the
  rank-major buffer into each parameter's ``all_gather_outputs[0]`` (``split_with_sizes_copy`` on the
  ``(world, -1)`` view);
- ``foreach_reduce``: cut every unsharded gradient into ``world`` dim-0 chunks (padded), lay them out rank-major
  in one flat ``reduce_dtype`` buffer, and reduce-scatter it (one collective); ``foreach_reduce_finish`` waits,
  all-reduces over the replicate dim (HSDP), divides, casts back and sets (or accumulates) each sharded gradient.

The collectives are pt_dist's (``pt_dist.all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``)
over the mesh's pt_dist groups. Where torch overlaps through CUDA streams, these return pt_dist ``Work`` handles
(``async_op=True``) that the group waits on later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp._fully_shard._fsdp_common import _get_dim0_padded_size, _to_dtype_if_needed
from pt_dist.fsdp._fully_shard._fsdp_param import FSDPParam
from pt_dist.process_group import ReduceOp

__all__ = ["AllGatherResult", "PendingReduce", "foreach_all_gather", "foreach_all_gather_copy_out",
           "foreach_reduce", "foreach_reduce_finish"]


class AllGatherResult(NamedTuple):
    all_gather_output: torch.Tensor
    all_gather_work: object | None  # pt_dist Work when async_op
    param_all_gather_input_dtypes: list[list[torch.dtype]]
    param_all_gather_input_numels: list[list[int]]
    all_gather_input_split_sizes: list[int]


@torch.no_grad()
def foreach_all_gather(fsdp_params: list[FSDPParam], group, async_op: bool, device: torch.device) -> AllGatherResult:
    world_size, rank = group.size(), group.rank()
    param_all_gather_inputs = [fsdp_param.all_gather_inputs for fsdp_param in fsdp_params]
    dtypes = [[t.dtype for t in ts] for ts in param_all_gather_inputs]
    numels = [[t.numel() for t in ts] for ts in param_all_gather_inputs]
    inputs = [t for ts in param_all_gather_inputs for t in ts]
    dtype = inputs[0].dtype
    if any(t.dtype != dtype for t in inputs):  # torch falls back to bytes; one group, one param_dtype here
        raise AssertionError(f"FSDP expects one all-gather dtype per group, got "
                             f"{sorted({str(t.dtype) for t in inputs})}")
    split_sizes = [t.numel() for t in inputs]
    input_numel = sum(split_sizes)
    all_gather_output = torch.empty(input_numel * world_size, dtype=dtype, device=device)
    all_gather_input = all_gather_output.narrow(0, input_numel * rank, input_numel)  # in place, NCCL's form
    torch._foreach_copy_(list(torch.split(all_gather_input, split_sizes)), inputs)
    del param_all_gather_inputs, inputs
    work = c10d.all_gather_into_tensor(all_gather_output, all_gather_input, group=group, async_op=async_op)
    return AllGatherResult(all_gather_output, work if async_op else None, dtypes, numels, split_sizes)


@torch.no_grad()
def foreach_all_gather_copy_out(all_gather_result: AllGatherResult, fsdp_params: list[FSDPParam], group) -> None:
    output, work, dtypes, numels, split_sizes = all_gather_result
    if work is not None:
        work.wait()
    world_size = group.size()
    outs = []
    for param_numels, param_dtypes, fsdp_param in zip(numels, dtypes, fsdp_params):
        fsdp_param.init_all_gather_outputs(param_numels, param_dtypes, world_size, output.device)
        fsdp_param.alloc_all_gather_outputs()
        outs.extend(t.view(world_size, -1) for t in fsdp_param.all_gather_outputs)
    # The refill is not a modification autograd should see: views saved in forward read the same values again.
    with torch.autograd._unsafe_preserve_version_counter(tuple(outs)):
        torch.split_with_sizes_copy(output.view(world_size, -1), split_sizes, dim=1, out=outs)


@dataclass
class PendingReduce:
    """One group's reduce-scatter in flight: what ``foreach_reduce_finish`` needs to land the gradients."""

    fsdp_params: list[FSDPParam]
    padded_unsharded_sizes: tuple[torch.Size, ...]
    reduce_scatter_input: torch.Tensor
    reduce_output: torch.Tensor
    work: object | None
    world_size: int
    all_reduce_group: object | None
    all_reduce_grads: bool
    all_reduce_op: ReduceOp
    postdivide_factor: float | None


@torch.no_grad()
def foreach_reduce(fsdp_params: list[FSDPParam], unsharded_grads: list[torch.Tensor], reduce_scatter_group,
                   reduce_dtype: torch.dtype, device: torch.device, gradient_divide_factor: float | None,
                   all_reduce_group, all_reduce_grads: bool,
                   force_sum_reduction_for_comms: bool = False) -> PendingReduce:
    """Copy the gradients in (clearing ``unsharded_grads``, which frees them) and start the reduce-scatter."""
    predivide_factor, postdivide_factor, reduce_scatter_op, all_reduce_op, premul = _get_gradient_divide_factors(
        reduce_scatter_group, all_reduce_group, reduce_dtype, gradient_divide_factor, force_sum_reduction_for_comms)
    world_size = reduce_scatter_group.size()
    padded_unsharded_sizes = tuple(_get_dim0_padded_size(g.size(), world_size) for g in unsharded_grads)
    input_numel = sum(s.numel() for s in padded_unsharded_sizes)
    reduce_scatter_input = torch.empty(input_numel, dtype=reduce_dtype, device=device)
    foreach_reduce_scatter_copy_in(unsharded_grads, reduce_scatter_input, world_size)
    unsharded_grads.clear()
    if predivide_factor is not None and predivide_factor != 1:
        reduce_scatter_input.div_(predivide_factor)
    if premul is not None:
        reduce_scatter_input.mul_(premul)
    reduce_output = torch.empty(input_numel // world_size, dtype=reduce_dtype, device=device)
    if world_size > 1:
        work = c10d.reduce_scatter_tensor(reduce_output, reduce_scatter_input, op=reduce_scatter_op,
                                             group=reduce_scatter_group, async_op=True)
    else:
        work = None
        reduce_output.copy_(reduce_scatter_input)
    return PendingReduce(list(fsdp_params), padded_unsharded_sizes, reduce_scatter_input, reduce_output, work,
                         world_size, all_reduce_group, all_reduce_grads, all_reduce_op, postdivide_factor)


@torch.no_grad()
def foreach_reduce_finish(pending: PendingReduce, partial_reduce_output: torch.Tensor | None,
                          all_reduce_hook=None) -> torch.Tensor | None:
    """Wait for the reduce-scatter; for HSDP all-reduce it over the replicate dim (or, without all-reduce, add it to
    ``partial_reduce_output`` and return that); ``all_reduce_hook`` (``set_all_reduce_hook``) on the reduced flat
    output; then set each parameter's sharded gradient. Returns the partial."""
    if pending.work is not None:
        pending.work.wait()
    reduce_output = pending.reduce_output
    if pending.all_reduce_group is not None:
        if not pending.all_reduce_grads:
            if partial_reduce_output is not None:
                partial_reduce_output += reduce_output
                return partial_reduce_output
            return reduce_output
        if partial_reduce_output is not None:
            reduce_output += partial_reduce_output
        c10d.all_reduce(reduce_output, op=pending.all_reduce_op, group=pending.all_reduce_group)
    if all_reduce_hook is not None:
        all_reduce_hook(reduce_output)
    if pending.postdivide_factor is not None and pending.postdivide_factor != 1:
        reduce_output.div_(pending.postdivide_factor)
    offset = 0
    for fsdp_param, padded_size in zip(pending.fsdp_params, pending.padded_unsharded_sizes):
        flat = _to_dtype_if_needed(reduce_output.narrow(0, offset, padded_size.numel() // pending.world_size),
                                   fsdp_param.orig_dtype)
        offset += padded_size.numel() // pending.world_size
        new_sharded_grad = torch.as_strided(flat, fsdp_param.sharded_size, fsdp_param.contiguous_sharded_stride,
                                            storage_offset=flat.storage_offset())
        if fsdp_param.offload_to_cpu:
            new_sharded_grad = new_sharded_grad.to("cpu")
        sharded_param = fsdp_param.sharded_param
        if sharded_param.grad is not None:
            getattr(sharded_param.grad, "_local_tensor", sharded_param.grad).add_(new_sharded_grad)
        else:
            sharded_param.grad = fsdp_param.to_sharded_dtensor(new_sharded_grad)
        for hook in (getattr(sharded_param, "_post_accumulate_grad_hooks", None) or {}).values():
            hook(sharded_param)
    return None


def foreach_reduce_scatter_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor,
                                   world_size: int) -> None:
    """Rank r's slot of the flat buffer = every gradient's dim-0 chunk r, zero-padded to the padded chunk size, in
    parameter order (torch's ``chunk_cat`` with mixed dtypes: the cast to ``reduce_dtype`` happens in the copy)."""
    rows = reduce_scatter_input.view(world_size, -1)
    offset = 0
    for grad in unsharded_grads:
        chunk = _get_dim0_padded_size(grad.size(), world_size).numel() // world_size
        dst, flat = rows[:, offset:offset + chunk], grad.reshape(-1)
        full, rem = divmod(flat.numel(), chunk) if chunk else (0, 0)
        dst[:full].copy_(flat[:full * chunk].view(full, chunk))
        if full < world_size:
            dst[full, :rem].copy_(flat[full * chunk:])
            dst[full, rem:].zero_()
            dst[full + 1:].zero_()
        offset += chunk


def _get_gradient_divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype: torch.dtype,
                                 factor: float | None, force_sum_reduction_for_comms: bool):
    """``(predivide, postdivide, reduce_scatter_op, all_reduce_op, premul)``: AVG for fp32/bf16; for dtypes that
    may overflow (fp16) SUM between a pre- and a post-division whose product is the data-parallel size, as
    torch's. A custom ``factor`` multiplies by ``premul = 1/factor`` before a SUM (torch's ``PREMUL_SUM``)."""
    overflow_risk = reduce_dtype not in (torch.float32, torch.bfloat16)
    data_parallel_size = reduce_scatter_group.size() if reduce_scatter_group is not None else 1
    if all_reduce_group is not None:
        data_parallel_size *= all_reduce_group.size()
    if not overflow_risk and not force_sum_reduction_for_comms:
        if factor is None:
            if data_parallel_size == 1:
                return None, None, ReduceOp.SUM, ReduceOp.SUM, None
            return None, None, ReduceOp.AVG, ReduceOp.AVG, None
        if reduce_scatter_group is not None and factor == reduce_scatter_group.size():
            return None, None, ReduceOp.AVG, ReduceOp.SUM, None
        return None, None, ReduceOp.SUM, ReduceOp.SUM, 1 / factor
    if factor is None:
        factor = float(data_parallel_size)
    if overflow_risk:
        pre_factor = 1
        while factor % pre_factor == 0 and factor / pre_factor > pre_factor:
            pre_factor *= 2
        return pre_factor, factor / pre_factor, ReduceOp.SUM, ReduceOp.SUM, None
    return None, factor, ReduceOp.SUM, ReduceOp.SUM, None
