"""Communication regions of tensor and sequence parallelism as autograd Functions.

Megatron-LM (Shoeybi et al., arXiv 1909.08053, §3, Fig. 3) names two conjugate operators:
``f`` is the identity forward and an all-reduce backward, ``g`` is an all-reduce forward and the
identity backward. A column-parallel linear is preceded by ``f``; a row-parallel linear is followed by ``g``.

Sequence parallelism (Korthikanti et al., arXiv 2205.05198, §4.2.2, Fig. 5) swaps them for
``g`` = all-gather along the sequence forward / reduce-scatter backward and
``g-bar`` = reduce-scatter forward / all-gather backward, so LayerNorm and dropout run on sequence shards.

Collectives are called through ``torch.distributed`` at call time (so a test can wrap them to count them).
Activations use Megatron's ``[sequence, batch, hidden]`` layout: the sequence is the first dimension.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps


def _tp():
    return ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()


def _reduce(x):
    size, group = _tp()
    if size == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def _split_along_last_dim(x):
    size, _ = _tp()
    if size == 1:
        return x
    if x.shape[-1] % size:
        raise ValueError(f"last dimension {x.shape[-1]} is not divisible by the tensor-parallel size {size}")
    return x.chunk(size, dim=-1)[ps.get_tensor_model_parallel_rank()].contiguous()


def _split_along_first_dim(x):
    size, _ = _tp()
    if size == 1:
        return x
    if x.shape[0] % size:
        raise ValueError(f"sequence length {x.shape[0]} is not divisible by the tensor-parallel size {size}")
    return x.chunk(size, dim=0)[ps.get_tensor_model_parallel_rank()].contiguous()


def _gather_along_first_dim(x):
    size, group = _tp()
    if size == 1:
        return x
    out = torch.empty((x.shape[0] * size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _gather_along_last_dim(x):
    # all-gather lands rank-major on dim 0; move those chunks to the last dim
    size, _ = _tp()
    if size == 1:
        return x
    moved = _gather_along_first_dim(x.movedim(-1, 0).contiguous())
    return torch.cat(moved.chunk(size, dim=0), dim=0).movedim(0, -1).contiguous()


def _reduce_scatter_along_first_dim(x):
    size, group = _tp()
    if size == 1:
        return x
    if x.shape[0] % size:
        raise ValueError(f"sequence length {x.shape[0]} is not divisible by the tensor-parallel size {size}")
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


class _CopyToModelParallelRegion(torch.autograd.Function):
    """The paper's ``f``: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad)


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """The paper's ``g``: all-reduce of partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        return _reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _ScatterToModelParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return _split_along_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_last_dim(grad)


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """All-gather the last dim forward (column-parallel ``gather_output``); split the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return _gather_along_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _split_along_last_dim(grad)


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Enter SP (after the embedding): keep this rank's sequence chunk; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return _split_along_first_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad)


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """SP's ``g``: all-gather the sequence forward; reduce-scatter backward.

    When the consumer is tensor-parallel (a column-parallel linear) each rank holds a partial
    gradient, so the backward is a reduce-scatter; otherwise (gathering for the loss) a split.
    """

    @staticmethod
    def forward(ctx, x, tensor_parallel_output_grad=True):
        ctx.tensor_parallel_output_grad = tensor_parallel_output_grad
        return _gather_along_first_dim(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.tensor_parallel_output_grad:
            return _reduce_scatter_along_first_dim(grad), None
        return _split_along_first_dim(grad), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """SP's ``g-bar``: reduce-scatter partial sums along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_along_first_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad)


def copy_to_tensor_model_parallel_region(input_):
    return _CopyToModelParallelRegion.apply(input_)


def reduce_from_tensor_model_parallel_region(input_):
    return _ReduceFromModelParallelRegion.apply(input_)


def scatter_to_tensor_model_parallel_region(input_):
    return _ScatterToModelParallelRegion.apply(input_)


def gather_from_tensor_model_parallel_region(input_):
    return _GatherFromModelParallelRegion.apply(input_)


def scatter_to_sequence_parallel_region(input_):
    return _ScatterToSequenceParallelRegion.apply(input_)


def gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad: bool = True):
    return _GatherFromSequenceParallelRegion.apply(input_, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(input_):
    return _ReduceScatterToSequenceParallelRegion.apply(input_)
