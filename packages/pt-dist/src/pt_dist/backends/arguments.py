"""Argument checks the native backends make on the calling rank, before any communication.

Each raises ``TypeError``/``ValueError`` naming the argument, as torch.distributed's own front end does: a bad
call must not reach the wire, where it would leave the ranks out of step.
"""

from __future__ import annotations

import operator

import torch


def check_tensor(t, what: str, op_name: str, written: bool = False, native: bool = True) -> None:
    """Up front, on the rank that got it. ``native=False`` (torch's adapters): any device and layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op_name}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if native and t.device.type != "cpu":
        raise ValueError(f"{op_name}: native backends take CPU tensors, {what} is on {t.device}")
    if native and t.layout != torch.strided:
        raise ValueError(f"{op_name}: {what} has layout {t.layout}; only dense tensors are supported (all_reduce "
                         f"also takes sparse COO ones)")
    if written and t.layout == torch.strided and torch._debug_has_internal_overlap(t) == 1:  # 1: an expand()
        raise ValueError(f"{op_name}: {what} has elements that share memory (expanded, stride 0) and cannot be "
                         f"written; pass a .clone() or .contiguous() of it")


def check_contiguous(t: torch.Tensor, what: str, op_name: str) -> None:
    """Where torch's backends refuse a strided tensor (all_to_all_single's input), before any communication."""
    if t.layout == torch.strided and not t.is_contiguous():
        raise ValueError(f"{op_name}: Tensors must be contiguous ({what} has strides {t.stride()} for shape "
                         f"{list(t.shape)}); pass {what}.contiguous(), as torch's backends require")


def lazy_view(t: torch.Tensor) -> bool:
    """A ``.conj()`` (complex) or negative view (``.conj().imag``) keeps the original bytes and a bit saying how to
    read them; transports that move raw bytes must not see one."""
    return t.is_conj() or t.is_neg()


def contig(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when the transports may read and write its raw bytes (dense, no lazy view bit), else a plain
    copy with its values (callers write outputs back with ``copy_``, which honours the bits)."""
    if lazy_view(t):
        t = t.resolve_conj().resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors the collective works on directly share bytes (non-contiguous ones become copies)."""
    if not (a.is_contiguous() and b.is_contiguous()) or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def read_apart(whole: torch.Tensor, block: torch.Tensor, rank: int, read: torch.Tensor) -> torch.Tensor:
    """``read``, or a copy of it where ``block`` overlaps ``whole`` other than as its block ``rank`` (NCCL's
    in-place form, which the algorithms handle): the collective would read bytes it is overwriting. gloo copies
    into buffers of its own, so such calls work there, on every rank; refusing them raised on only some."""
    if overlap(whole, block) and block.data_ptr() != whole.data_ptr() + rank * block.numel() * block.element_size():
        return read.clone()
    return read


def check_tag(tag, op_name: str) -> int:
    try:
        value = operator.index(tag)
    except TypeError:
        value = None
    if value is None or not -(2 ** 31) <= value < 2 ** 31:  # c10d's tags are C ints
        raise ValueError(f"{op_name}: tag must be an int in [-2**31, 2**31), got {tag!r}")
    return value


def as_rank(rank, what: str) -> int:
    """An int (numpy's too); 1.0 or "1" is a caller's mistake, refused as torch refuses it."""
    if isinstance(rank, bool) or not hasattr(rank, "__index__"):
        raise TypeError(f"{what} must be an int rank, got {rank!r}")
    return operator.index(rank)


# the front ends' shared checks, each raising before any communication ------------------------------------
def desc(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)}"


def written(t, what: str, op_name: str) -> torch.Tensor:
    """``t`` checked as an output and detached (c10d writes below autograd: parameters in place, as torch)."""
    check_tensor(t, what, op_name, written=True)
    return t.detach()


def read(t, what: str, op_name: str) -> torch.Tensor:
    check_tensor(t, what, op_name)
    return t.detach()


def reduced(t, op, op_name: str, what: str = "tensor"):
    """A reduction's output and op: (``t`` detached, the ``ReduceOp``), checked for each other."""
    from pt_dist.process_group import ReduceOp, check_reduce_dtype

    t, op = written(t, what, op_name), ReduceOp.of(op)
    check_reduce_dtype(op, t.dtype, op_name)
    return t, op


def check_root(root, what: str, op_name: str, size: int, group_name: str) -> None:
    if not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(f"{op_name}: {what}={root!r} is not a rank of group {group_name!r} (size {size})")


def check_world_times(whole: torch.Tensor, part: torch.Tensor, size: int, op_name: str, names: tuple[str, str]):
    """``whole`` must hold ``size`` x ``part`` of the same dtype (all-gather's output, reduce-scatter's input)."""
    if whole.dtype != part.dtype or whole.numel() != part.numel() * size:
        raise ValueError(f"{op_name}: {names[0]} {desc(whole)} must hold world_size={size} x {names[1]} "
                         f"{desc(part)} of the same dtype")


def through(t: torch.Tensor, fn, write_back: bool = True) -> list[torch.Tensor]:
    """``fn`` on a flat contiguous view of ``t`` (a copy where ``t`` is strided or lazy), written back into ``t``."""
    buf = contig(t)
    fn(buf.view(-1))
    if write_back and buf is not t:
        t.copy_(buf)
    return [t]


def rooted_list(tensors, tensor: torch.Tensor, root: int, rank: int, size: int, op_name: str, what: str):
    """gather's and scatter's list, as torch checks it: group-size tensors like ``tensor`` on the root, none
    elsewhere. Returns them and ``tensor``, detached; where one shares memory with ``tensor`` (the root's own block
    may be its tensor, as gloo allows), the side the root reads is a copy."""
    root_arg = "dst" if op_name == "gather" else "src"
    if rank != root:
        if tensors:
            raise ValueError(f"{op_name}: {what} must NOT be given on rank {rank}, only on the {root_arg} rank {root}")
        return [], tensor.detach()
    if not tensors or len(tensors) != size:
        raise ValueError(f"{op_name}: {what} on {root_arg} rank {root} must list group size={size} tensors, got "
                         f"{None if tensors is None else len(tensors)}")
    for i, t in enumerate(tensors):
        check_tensor(t, f"{what}[{i}]", op_name, written=op_name == "gather")
        if t.dtype != tensor.dtype or t.numel() != tensor.numel():
            raise ValueError(f"{op_name}: {what}[{i}] is {desc(t)}, tensor is {desc(tensor)}")
    tensors, tensor = [t.detach() for t in tensors], tensor.detach()
    if any(overlap(t, tensor) for t in tensors):
        if op_name == "gather":
            tensor = tensor.clone()
        else:
            tensors = [t.clone() if overlap(t, tensor) else t for t in tensors]
    return tensors, tensor


def splits(t: torch.Tensor, sizes, what: str, size: int) -> list[int]:
    """all_to_all_single's split sizes along dim 0 (even when not given)."""
    rows = t.shape[0]
    if sizes is None or len(sizes) == 0:
        if rows % size:
            raise ValueError(f"all_to_all_single: dim 0 ({rows}) is not divisible by group size {size}; pass {what}")
        return [rows // size] * size
    if any(isinstance(s, bool) or not hasattr(s, "__index__") for s in sizes):
        raise TypeError(f"all_to_all_single: {what} must be a list of ints, got {sizes!r}")
    sizes = [operator.index(s) for s in sizes]
    if len(sizes) != size or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {what}={sizes} must have {size} non-negative entries summing to dim 0 "
                         f"({rows})")
    return sizes
