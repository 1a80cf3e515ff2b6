"""Collectives that autograd can differentiate through: torch.distributed.nn.functional's, on any pt_dist group.

The plain collectives work below autograd (in place, no graph). These return new tensors (those with an
output argument also write into it, as torch's do) and register a backward that is itself a collective: the
adjoint of an all-gather is a reduce-scatter of the gradients (each rank's slice gets the sum of what every
rank's loss said about it), of a broadcast a reduce to the source (and of a reduce a broadcast from the
destination), of a gather a scatter from the root (and the reverse), of an all-to-all the reverse
all-to-all, and a sum all-reduce is its own adjoint. Every rank must run backward through the same
collectives in the same order, as with DDP. What contrastive losses gather features with, and what
sequence/tensor parallelism is built from.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.list_collectives import all_to_all as _all_to_all_list
from pt_dist._compat.list_collectives import reduce_scatter as _reduce_scatter_list
from pt_dist.process_group import ReduceOp

__all__ = ["all_gather", "all_reduce", "all_to_all", "all_to_all_single", "broadcast", "gather", "reduce",
           "reduce_scatter", "scatter"]


def _on_copy(tensor: torch.Tensor, collective) -> torch.Tensor:
    """The collectives write in place; autograd needs the input untouched, so they run on a copy."""
    out = tensor.clone(memory_format=torch.contiguous_format)
    collective(out)
    return out


class _AllReduce(Function):
    @staticmethod
    def forward(ctx, op, group, tensor):
        ctx.op, ctx.group = op, group
        return _on_copy(tensor, lambda out: c10d.all_reduce(out, op=op, group=group))

    @staticmethod
    def backward(ctx, grad):
        return None, None, _AllReduce.apply(ctx.op, ctx.group, grad)  # SUM and AVG are their own adjoints


class _AllGather(Function):
    @staticmethod
    def forward(ctx, group, tensor):
        ctx.group = group
        outs = [torch.empty_like(tensor, memory_format=torch.contiguous_format)
                for _ in range(c10d.get_world_size(group))]
        c10d.all_gather(outs, tensor.contiguous(), group=group)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        mine = torch.empty_like(grads[c10d.get_rank(group=ctx.group)], memory_format=torch.contiguous_format)
        return None, _ReduceScatter.apply(ReduceOp.SUM, ctx.group, mine, *grads)


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx, op, group, output, *inputs):
        ctx.group = group
        return _on_copy(output, lambda out: _reduce_scatter_list(out, [t.contiguous() for t in inputs], op=op,
                                                                 group=group))

    @staticmethod
    def backward(ctx, grad):
        return (None, None, None, *_AllGather.apply(ctx.group, grad))


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, src, group, tensor):
        ctx.src, ctx.group = src, group
        return _on_copy(tensor, lambda out: c10d.broadcast(out, src=src, group=group))

    @staticmethod
    def backward(ctx, grad):  # only the source's input reached anyone's loss
        total = _on_copy(grad, lambda out: c10d.reduce(out, dst=ctx.src, group=ctx.group))
        return None, None, total if c10d.get_rank() == ctx.src else torch.zeros_like(grad)


class _Reduce(Function):
    @staticmethod
    def forward(ctx, dst, group, tensor):
        ctx.dst, ctx.group = dst, group
        return _on_copy(tensor, lambda out: c10d.reduce(out, dst=dst, group=group))

    @staticmethod
    def backward(ctx, grad):  # only the destination's output is the sum; every input fed it once
        return None, None, _Broadcast.apply(ctx.dst, ctx.group, grad)


class _Gather(Function):
    @staticmethod
    def forward(ctx, dst, group, tensor):
        ctx.dst, ctx.group = dst, group
        outs = [torch.zeros_like(tensor, memory_format=torch.contiguous_format)
                for _ in range(c10d.get_world_size(group))]
        c10d.gather(tensor.contiguous(), outs if c10d.get_rank() == dst else None, dst=dst, group=group)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):  # the root's gradients for each rank's piece go back to that rank
        return None, None, _Scatter.apply(ctx.dst, ctx.group, *grads)


class _Scatter(Function):
    @staticmethod
    def forward(ctx, src, group, *tensors):
        ctx.src, ctx.group = src, group
        out = torch.zeros_like(tensors[0], memory_format=torch.contiguous_format)
        ins = [t.contiguous() for t in tensors] if c10d.get_rank() == src else None
        c10d.scatter(out, ins, src=src, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # the source's pieces get back what each rank's loss said; others' got nowhere
        return None, None, *_Gather.apply(ctx.src, ctx.group, grad)


class _AllToAll(Function):
    @staticmethod
    def forward(ctx, group, shapes, *tensors):
        ctx.group, ctx.shapes = group, [t.shape for t in tensors]
        outs = [tensors[0].new_empty(shape) for shape in shapes]
        _all_to_all_list(outs, [t.contiguous() for t in tensors], group=group)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        return None, None, *_AllToAll.apply(ctx.group, ctx.shapes, *grads)


class _AllToAllSingle(Function):
    @staticmethod
    def forward(ctx, group, out_splits, in_splits, out_shape, tensor):
        ctx.group, ctx.splits, ctx.in_shape = group, (out_splits, in_splits), tensor.shape
        out = tensor.new_empty(out_shape)
        c10d.all_to_all_single(out, tensor.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # the reverse exchange, into the input's shape (not the gradient's)
        out_splits, in_splits = ctx.splits
        return None, None, None, None, _AllToAllSingle.apply(ctx.group, in_splits, out_splits, ctx.in_shape, grad)


def _fill(outputs, results) -> None:
    """torch's versions write into the outputs passed in (and return them): so do these, besides returning."""
    with torch.no_grad():
        for out, res in zip(outputs, results):
            out.copy_(res)


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced over the group (SUM or AVG: the ops whose adjoint is themselves)."""
    op = ReduceOp.of(op)
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(f"all_reduce: autograd supports ReduceOp.SUM and AVG, got ReduceOp.{op.name}")
    return _AllReduce.apply(op, group, tensor)


def all_gather(tensor: torch.Tensor, group=None) -> tuple[torch.Tensor, ...]:
    """Every rank's ``tensor``, by group rank; gradients flow back to the rank each came from."""
    return _AllGather.apply(group, tensor)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """``input_list[i]`` summed over ranks, on group rank i: written into ``output`` and returned as a tensor the
    graph goes through."""
    op = ReduceOp.of(op)
    if op is not ReduceOp.SUM:
        raise ValueError(f"reduce_scatter: autograd supports ReduceOp.SUM, got ReduceOp.{op.name}")
    result = _ReduceScatter.apply(op, group, output, *input_list)
    _fill([output], [result])
    return result


def broadcast(tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """A new tensor holding ``src``'s (a global rank); the gradients of every rank's copy sum up at ``src``."""
    return _Broadcast.apply(src, group, tensor)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None) -> torch.Tensor:
    """``pt_dist.all_to_all_single``'s exchange: written into ``output`` and returned as a tensor the graph goes
    through (its gradient is the reverse exchange, shaped like ``input``)."""
    out_splits = list(output_split_sizes) if output_split_sizes is not None else None
    in_splits = list(input_split_sizes) if input_split_sizes is not None else None
    result = _AllToAllSingle.apply(group, out_splits, in_splits, output.shape, input)
    _fill([output], [result])
    return result


def reduce(tensor: torch.Tensor, dst: int, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """A new tensor: on ``dst`` (a global rank) the sum over the group (elsewhere undefined, as torch's); every
    rank's input gets the gradient of ``dst``'s output."""
    if ReduceOp.of(op) is not ReduceOp.SUM:
        raise ValueError(f"reduce: autograd supports ReduceOp.SUM, got ReduceOp.{ReduceOp.of(op).name}")
    return _Reduce.apply(dst, group, tensor)


def gather(tensor: torch.Tensor, dst: int = 0, group=None) -> tuple[torch.Tensor, ...]:
    """Every rank's ``tensor`` on ``dst`` (a global rank), by group rank; zeros elsewhere, as torch's."""
    return _Gather.apply(dst, group, tensor)


def scatter(tensors, src: int = 0, group=None) -> torch.Tensor:
    """``tensors[i]`` of ``src`` (a global rank) on group rank i; every rank passes same-shaped ``tensors``."""
    tensors = list(tensors)
    if len({t.shape for t in tensors}) > 1:
        raise ValueError(f"scatter: the tensors must share one shape, got {[list(t.shape) for t in tensors]}")
    return _Scatter.apply(src, group, *tensors)


def all_to_all(output_tensor_list, input_tensor_list, group=None) -> tuple[torch.Tensor, ...]:
    """This rank's ``input_tensor_list[j]`` lands in rank j's entry i (i: this rank), as ``pt_dist.all_to_all``;
    shapes may differ per peer. Written into ``output_tensor_list`` and returned as tensors the graph goes through."""
    results = _AllToAll.apply(group, [t.shape for t in output_tensor_list], *input_tensor_list)
    _fill(output_tensor_list, results)
    return results
