"""The list forms of two collectives: torch.distributed's ``all_to_all`` and ``reduce_scatter``.

c10d's NCCL group runs both by flattening the lists into one buffer and calling the single-tensor
collective (``all_to_all_single`` with the tensors' sizes as splits; ``reduce_scatter_tensor``); so do we,
on every backend. Tensors may differ in shape from peer to peer in ``all_to_all`` (Megatron's and
DeepSpeed's MoE token dispatch sends each expert a different number of tokens); gloo's own ``all_to_all``
refuses that, ours does not. Ranks that disagree on a size raise on every native-backend rank.
"""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.distributed_c10d import GroupMember
from pt_dist.process_group import ReduceOp
from pt_dist.work import Work

__all__ = ["all_to_all", "reduce_scatter"]


def _check_list(op: str, what: str, tensors, world: int, dtype: torch.dtype | None) -> torch.dtype:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != world:
        raise ValueError(f"{op}: {what} must be a list of group size={world} tensors, got "
                         f"{type(tensors).__name__} of {len(tensors) if hasattr(tensors, '__len__') else '?'}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {what}[{i}] must be a torch.Tensor, got {type(t).__name__}")
        dtype = t.dtype if dtype is None else dtype
        if t.dtype != dtype:
            raise ValueError(f"{op}: {what}[{i}] is {t.dtype}, expected {dtype} like the others")
    return dtype


def _packed(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


class _ThenWork(Work):
    """The Work of a collective followed by a local step (``post``) that must run before waiters see the result;
    ``post`` runs once, where the inner collective's future completes."""

    def __init__(self, op_name: str, inner: Work, post, result):
        super().__init__(op_name)

        def finish(fut):
            try:
                fut.wait()
                with torch.inference_mode():
                    post()
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on this Work
                self._finish(exc=e)
            else:
                self._finish(result)
        inner.get_future().add_done_callback(finish)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """``input_tensor_list[j]`` of this rank lands in ``output_tensor_list[i]`` of rank j, where i is this rank's
    group rank: rank i's ``output_tensor_list[j]`` must have the size of rank j's ``input_tensor_list[i]``."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    world = c10d.get_world_size(group)
    dtype = _check_list("all_to_all", "input_tensor_list", input_tensor_list, world, None)
    _check_list("all_to_all", "output_tensor_list", output_tensor_list, world, dtype)
    inp = _packed(input_tensor_list)
    out = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=dtype, device=inp.device)
    in_splits, out_splits = [t.numel() for t in input_tensor_list], [t.numel() for t in output_tensor_list]

    def unpack():
        for t, piece in zip(output_tensor_list, out.split(out_splits)):
            t.detach().copy_(piece.view(t.shape))
    work = c10d.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)
    if not async_op:
        with torch.inference_mode():
            unpack()
        return None
    return _ThenWork("all_to_all", work, unpack, list(output_tensor_list))


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``output`` = ``input_list[i]`` reduced over all ranks, on the group's rank i; every entry has ``output``'s
    shape."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"reduce_scatter: output must be a torch.Tensor, got {type(output).__name__}")
    _check_list("reduce_scatter", "input_list", input_list, c10d.get_world_size(group), output.dtype)
    for i, t in enumerate(input_list):
        if t.shape != output.shape:
            raise ValueError(f"reduce_scatter: input_list[{i}] has shape {list(t.shape)}, output has "
                             f"{list(output.shape)}")
    return c10d.reduce_scatter_tensor(output, _packed(input_list), op, group=group, async_op=async_op)
