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
