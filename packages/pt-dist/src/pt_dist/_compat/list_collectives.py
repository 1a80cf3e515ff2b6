"""Collectives between lists and single tensors: ``all_to_all``, ``reduce_scatter``, the ``*_coalesced`` pair,
``gather_single``.

c10d's NCCL group runs the list forms by flattening the lists into one buffer and calling the single-tensor
collective (``all_to_all_single`` with the tensors' sizes as splits; ``reduce_scatter_tensor``); so do we,
on every backend. Tensors may differ in shape from peer to peer in ``all_to_all`` (Megatron's and
DeepSpeed's MoE token dispatch sends each expert a different number of tokens); gloo's own ``all_to_all``
refuses that, ours does not. Ranks that disagree on a size raise on every native-backend rank.
``all_reduce_coalesced`` / ``all_gather_coalesced`` move many tensors in one collective, the bucketing DDP
does for gradients; ``gather_single`` is
``gather`` into one tensor, the list being views of it.
"""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.process_group import ReduceOp
from pt_dist.work import Work

__all__ = ["all_gather_coalesced", "all_gather_single", "all_reduce_coalesced", "all_to_all", "gather_into_tensor",
           "gather_single", "reduce_scatter", "reduce_scatter_single"]


def _check_list(op: str, what: str, tensors, world: int, dtype: torch.dtype | None, like: str = "") -> torch.dtype:
    """Every entry a tensor of ``dtype`` (default: the first entry's); ``like`` names where ``dtype`` came from."""
    like = like or "the others"
    if not isinstance(tensors, (list, tuple)) or len(tensors) != world:
        raise ValueError(f"{op}: {what} must be a list of group size={world} tensors, got "
                         f"{type(tensors).__name__} of {len(tensors) if hasattr(tensors, '__len__') else '?'}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {what}[{i}] must be a torch.Tensor, got {type(t).__name__}")
        dtype = t.dtype if dtype is None else dtype
        if t.dtype != dtype:
            raise ValueError(f"{op}: {what}[{i}] is {t.dtype}, expected {dtype} like {like}")
    return dtype


def _packed(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


class _ThenWork(Work):
    """The Work of a collective followed by a local step (``post``) that must run before waiters see the result;
    ``post`` runs once, where the inner collective's future completes. It is chained with ``then``, so on GPUs
    its copies run on a stream a CUDA-aware future records, and ``wait()`` orders the caller's stream after both
    the collective and them, as torch's Work does (NCCL's future completes at launch; on CPU all this is moot)."""

    def __init__(self, op_name: str, inner: Work, post, result):
        super().__init__(op_name)
        self._inner: Work | None = inner
        # (a wait from the group's thread runs the inner op)
        self._blocker = lambda _, timeout=None: inner._before_blocking(timeout)

        def step(fut):
            try:
                fut.wait()
                with torch.inference_mode():
                    post()
            except BaseException as e:  # noqa: BLE001 - kept as it is (a then-callback's error would be rewrapped)
                return e
            return None

        def finish(fut):
            if not inner._streams:  # (no stream to order: let go of its packed buffer)
                self._inner = self._blocker = None
            err = fut.value()
            self._finish(exc=err) if err is not None else self._finish(result)

        self._chained = inner.get_future().then(step)
        self._chained.add_done_callback(finish)

    def is_completed(self) -> bool:
        inner = self._inner
        return self._done.is_set() and (inner is None or inner.is_completed())  # (NCCL's: once the GPU is done)

    def wait(self, timeout=None) -> bool:
        super().wait(timeout)
        inner = self._inner
        if inner is not None:  # done: on GPUs these order the current stream after the collective and the copies
            inner.wait()
            self._chained.wait()
        return True


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """``input_tensor_list[j]`` of this rank lands in ``output_tensor_list[i]`` of rank j, where i is this rank's
    group rank: rank i's ``output_tensor_list[j]`` must have the size of rank j's ``input_tensor_list[i]``."""
    if c10d._rank_not_in_group(group, "all_to_all"):
        return None
    world = c10d.get_world_size(group)
    dtype = _check_list("all_to_all", "input_tensor_list", input_tensor_list, world, None)
    _check_list("all_to_all", "output_tensor_list", output_tensor_list, world, dtype, "input_tensor_list")
    inp = _packed(input_tensor_list)
    out = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=dtype, device=inp.device)
    in_splits, out_splits = [t.numel() for t in input_tensor_list], [t.numel() for t in output_tensor_list]

    def unpack():
        for t, piece in zip(output_tensor_list, out.split(out_splits)):
            t.detach().copy_(piece.view(t.shape))
    work = c10d.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)
    return _then(work, unpack, "all_to_all", list(output_tensor_list), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``output`` = ``input_list[i]`` reduced over all ranks, on the group's rank i. Sizes may differ from rank to
    rank, as torch's gloo allows: ``input_list[j]`` has rank j's output size on every rank (the blocks travel
    zero-padded to the longest, through ``reduce_scatter_tensor``)."""
    if c10d._rank_not_in_group(group, "reduce_scatter"):
        return None
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"reduce_scatter: output must be a torch.Tensor, got {type(output).__name__}")
    _check_list("reduce_scatter", "input_list", input_list, c10d.get_world_size(group), output.dtype, "the output")
    mine = input_list[c10d.get_rank(group)]
    if mine.numel() != output.numel():
        raise ValueError(f"reduce_scatter: input_list[{c10d.get_rank(group)}] (this rank's block) has "
                         f"{mine.numel()} elements, output has {output.numel()}")
    sizes = [t.numel() for t in input_list]
    if len(set(sizes)) == 1:
        return c10d.reduce_scatter_tensor(output, _packed(input_list), op, group=group, async_op=async_op)
    width = max(sizes)
    padded = torch.zeros(len(sizes), width, dtype=output.dtype, device=output.device)
    for row, t in zip(padded, input_list):
        row[:t.numel()] = t.detach().reshape(-1)
    out = torch.empty(width, dtype=output.dtype, device=output.device)

    def unpack():
        output.detach().copy_(out[:output.numel()].view(output.shape))
    work = c10d.reduce_scatter_tensor(out, padded.view(-1), op, group=group, async_op=async_op)
    return _then(work, unpack, "reduce_scatter", [output], async_op)


def _same_dtype(op: str, what: str, tensors) -> torch.dtype:
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{op}: {what} must be a non-empty list of tensors, got {tensors!r}")
    return _check_list(op, what, tensors, len(tensors), None)


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Every tensor of the list all-reduced, in one collective over their concatenation (one dtype; torch's
    returns a Future, not a Work, with ``async_op``)."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if c10d._rank_not_in_group(group, "all_reduce_coalesced"):
        return None
    _same_dtype("all_reduce_coalesced", "tensors", tensors)
    flat = _packed(tensors)

    def unpack():
        for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.detach().copy_(piece.view(t.shape))
    return _then(c10d.all_reduce(flat, op, group=group, async_op=async_op), unpack, "all_reduce_coalesced",
                 list(tensors), async_op, future=True)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op: bool = False):
    """``output_tensor_lists[i][j]`` = rank i's ``input_tensor_list[j]``, in one all-gather (a Future with
    ``async_op``, as torch's). Argument errors are torch's: TypeError for a wrong kind, RuntimeError (gloo's)
    for sizes and dtypes."""
    if c10d._rank_not_in_group(group, "all_gather_coalesced"):
        return None
    dtype = _same_dtype("all_gather_coalesced", "input_tensor_list", input_tensor_list)
    world = c10d.get_world_size(group)
    if not isinstance(output_tensor_lists, list) or not all(isinstance(o, list) for o in output_tensor_lists):
        raise TypeError(f"all_gather_coalesced: Invalid function argument. Expected parameter `output_tensor_lists` "
                        f"of type List[List[torch.Tensor]], got {_brief_kinds(output_tensor_lists)}")
    for i, outs in enumerate(output_tensor_lists):  # torch's front end checks each list's dtypes before gloo
        if len({t.dtype for t in outs if isinstance(t, torch.Tensor)}) > 1:
            raise ValueError(f"all_gather_coalesced: Invalid usage of tensors with different dtypes in "
                             f"output_tensor_lists[{i}]: {[t.dtype for t in outs]}")
    if len(output_tensor_lists) != world:
        raise RuntimeError(f"all_gather_coalesced: output lists should be equal to world size ({world}), got "
                           f"{len(output_tensor_lists)}")
    sizes = [t.numel() for t in input_tensor_list]
    for i, outs in enumerate(output_tensor_lists):
        if len(outs) != len(sizes) or not all(isinstance(t, torch.Tensor) for t in outs):
            raise TypeError(f"all_gather_coalesced: output_tensor_lists[{i}] must list {len(sizes)} tensors, one per "
                            f"input, got {_brief_kinds(outs)}")
        for j, t in enumerate(outs):
            if t.numel() != sizes[j]:
                raise RuntimeError(f"all_gather_coalesced: invalid size of output tensor at index {i} "
                                   f"(output_tensor_lists[{i}][{j}] has {t.numel()} elements, input {sizes[j]})")
            if t.dtype != dtype:
                raise RuntimeError(f"all_gather_coalesced: invalid tensor type at index {i} "
                                   f"(output_tensor_lists[{i}][{j}] is {t.dtype}, the inputs {dtype})")
    inp = _packed(input_tensor_list)
    out = torch.empty(world * inp.numel(), dtype=dtype, device=inp.device)

    def unpack():
        for outs, block in zip(output_tensor_lists, out.chunk(world)):
            for t, piece in zip(outs, block.split(sizes)):
                t.detach().copy_(piece.view(t.shape))
    work = c10d.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
    return _then(work, unpack, "all_gather_coalesced", output_tensor_lists, async_op, future=True)


def _brief_kinds(x) -> str:
    return f"a {type(x).__name__} of {[type(e).__name__ for e in x][:4]}" if isinstance(x, (list, tuple)) else \
        type(x).__name__


def _then(work, post, op_name: str, result, async_op: bool, future: bool = False):
    if not async_op:
        with torch.inference_mode():
            post()
        return None
    done = _ThenWork(op_name, work, post, result)
    return done.get_future() if future else done


def gather_single(tensor, gather_tensor=None, dst: int | None = None, group=None, async_op: bool = False,
                  group_dst: int | None = None):
    """Every rank's ``tensor`` into one contiguous ``gather_tensor`` on ``dst``, rank by rank (shaped
    ``[world * n, ...]`` or ``[world, *shape]``: only the element count is checked, as torch's)."""
    if c10d._rank_not_in_group(group, "gather_single"):
        return None
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gather_single: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    root = c10d._peer(group, dst, group_dst, "dst")
    parts = None
    if c10d.get_rank(group) == root:
        world = c10d.get_world_size(group)
        if not isinstance(gather_tensor, torch.Tensor):
            raise ValueError("gather_single: gather_tensor must be given on the destination rank")
        if gather_tensor.dtype != tensor.dtype:
            raise ValueError(f"gather_single: gather_tensor is {gather_tensor.dtype}, tensor is {tensor.dtype}")
        if not gather_tensor.is_contiguous():
            raise ValueError("gather_single: gather_tensor must be contiguous")
        if gather_tensor.numel() != world * tensor.numel():
            raise ValueError(f"gather_single: gather_tensor has {gather_tensor.numel()} elements, the group needs "
                             f"{world} x {tensor.numel()}")
        parts = [row.view(tensor.shape) for row in gather_tensor.view(world, tensor.numel()).unbind(0)]
    return c10d.gather(tensor, parts, group=group, async_op=async_op, group_dst=root)


gather_into_tensor = gather_single  # torch's older name for it
all_gather_single = c10d.all_gather_into_tensor  # torch 2.15's names for the two single-tensor collectives
reduce_scatter_single = c10d.reduce_scatter_tensor
