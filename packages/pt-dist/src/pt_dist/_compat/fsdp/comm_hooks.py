"""FSDP1's communication hooks (torch/distributed/algorithms/_comm_hooks/default_hooks.py): what
``FSDP.register_comm_hook(state, hook)`` calls in place of a unit's gradient reduction, over pt_dist groups.
``hook(state, grad)`` all-reduces in place (``NO_SHARD``); ``hook(state, grad, output)`` reduce-scatters
``grad`` into ``output`` (the sharded strategies). The hook divides: by ``gradient_predivide_factor`` before and
``gradient_postdivide_factor`` after, whose product is the world size (torch's split, against overflow)."""

from __future__ import annotations

import functools

import torch

from pt_dist import distributed_c10d as c10d

__all__ = ["DefaultState", "LowPrecisionState", "allreduce_hook", "bf16_compress_hook", "fp16_compress_hook",
           "reduce_scatter_hook"]


class DefaultState:
    """The group a hook reduces over, and the two division factors."""

    __slots__ = ["process_group", "world_size", "gradient_predivide_factor", "gradient_postdivide_factor"]

    def __init__(self, process_group):
        if process_group is None:
            raise ValueError(f"Expected to pass in an explicit ProcessGroup to {self}.")
        self.process_group = process_group
        self.world_size = c10d.get_world_size(process_group)
        self.gradient_predivide_factor = self._get_gradient_predivide_factor(self.world_size)
        self.gradient_postdivide_factor = self.world_size / self.gradient_predivide_factor

    @staticmethod
    def _get_gradient_predivide_factor(world_size: int) -> float:
        factor = 1
        while world_size % factor == 0 and world_size / factor > factor:
            factor *= 2
        return float(factor)


class LowPrecisionState(DefaultState):
    """``DefaultState`` plus the dtype the gradient returns to after a low-precision reduction."""

    __slots__ = ["parameter_type"]

    def __init__(self, process_group, parameter_type=torch.float32):
        super().__init__(process_group)
        self.parameter_type = parameter_type


def allreduce_hook(state: DefaultState, grad: torch.Tensor) -> None:
    if state.gradient_predivide_factor > 1:
        grad.div_(state.gradient_predivide_factor)
    c10d.all_reduce(grad, group=state.process_group)
    if state.gradient_postdivide_factor > 1:
        grad.div_(state.gradient_postdivide_factor)


def reduce_scatter_hook(state: DefaultState, grad: torch.Tensor, output: torch.Tensor) -> None:
    if state.gradient_predivide_factor > 1:
        grad.div_(state.gradient_predivide_factor)
    c10d.reduce_scatter_tensor(output, grad, group=state.process_group)
    if state.gradient_postdivide_factor > 1:
        output.div_(state.gradient_postdivide_factor)


def _low_precision_hook(prec: torch.dtype, state: LowPrecisionState, grad: torch.Tensor,
                        output: torch.Tensor | None) -> None:
    """Reduce in ``prec``, then back to ``state.parameter_type`` (the tensors' data swapped, as torch's)."""
    if grad.dtype != prec:
        grad.data = grad.data.to(prec)
    if output is not None:
        if output.dtype != prec:
            output.data = output.data.to(prec)
        reduce_scatter_hook(state, grad, output)
        output.data = output.data.to(state.parameter_type)
    else:
        allreduce_hook(state, grad)
        grad.data = grad.data.to(state.parameter_type)


def fp16_compress_hook(state: LowPrecisionState, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    return functools.partial(_low_precision_hook, torch.float16)(state, grad, output)


def bf16_compress_hook(state: LowPrecisionState, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    return functools.partial(_low_precision_hook, torch.bfloat16)(state, grad, output)
