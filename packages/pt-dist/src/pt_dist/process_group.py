"""``ProcessGroup``: the collective interface every backend implements, plus ``ReduceOp``.

c10d's ProcessGroup (torch/csrc/distributed/c10d/ProcessGroup.hpp) in miniature: a group has a rank
and a size, and each collective takes group-local ranks and returns a ``Work``. ``async_op=True``
returns immediately; otherwise the returned ``Work`` is already complete.
"""

from __future__ import annotations

import abc
import enum
import functools

import torch

from pt_dist._infra.errors import DistError, DistStoreError
from pt_dist.work import Work

__all__ = ["DistError", "DistStoreError", "ProcessGroup", "ReduceOp", "combine_", "check_reduce_dtype"]


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"  # bitwise and/or/xor: integer and bool dtypes (a "found_inf" flag, a visited-set)
    BOR = "bor"
    BXOR = "bxor"

    @classmethod
    def of(cls, op) -> ReduceOp:
        """Accept our enum, a name ("sum"), or torch.distributed.ReduceOp."""
        if isinstance(op, cls):
            return op
        op = getattr(op, "op", op)  # a torch.distributed.ReduceOp instance wraps its RedOpType
        name = str(op).rsplit(".", 1)[-1].upper()
        name = {"PREMUL_SUM": ""}.get(name, name)
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unsupported reduce op {op!r}; expected one of {[m.name for m in cls]}") from None


def supports_complex(op) -> bool:
    """Whether an all-reduce with ``op`` takes complex tensors: not the orderings, not the bitwise ops (torch's
    answers False for PRODUCT too; ours multiplies complex numbers)."""
    return ReduceOp.of(op) not in (ReduceOp.MIN, ReduceOp.MAX, *_BITWISE)


def check_reduce_dtype(op: ReduceOp, dtype: torch.dtype, op_name: str, cpu_fold: bool = True) -> None:
    """Reject (op, dtype) pairs torch itself cannot reduce, before any communication. ``cpu_fold``: the reduction
    runs in torch's CPU kernels (native backends), not in a library that may support more (NCCL's fp8)."""
    if op is ReduceOp.AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"{op_name}: ReduceOp.AVG needs a floating or complex dtype, got {dtype}")
    if op in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"{op_name}: ReduceOp.{op.name} needs an integer or bool dtype, got {dtype}")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dtype.is_complex:
        raise ValueError(f"{op_name}: ReduceOp.{op.name} is undefined for complex dtype {dtype}")
    why = _cannot_fold(op, dtype) if cpu_fold else ""
    if why:
        raise ValueError(f"{op_name}: torch cannot compute ReduceOp.{op.name} on {dtype} ({why}); only data-moving "
                         f"collectives (broadcast, all-gather, scatter, all-to-all, p2p) take it")


@functools.cache
def _cannot_fold(op: ReduceOp, dtype: torch.dtype) -> str:
    """Why torch's CPU kernels cannot fold (and average) ``dtype``: float8 and uint16/32/64 have no add, say.

    Probed on one element and on two: a slice may be one element long, and some kernels exist only vectorised
    (float8's mul), so a dtype that folds pairs may still fail mid-collective on a single element."""
    try:
        for n in (1, 2):
            a = torch.zeros(n, dtype=dtype)
            combiner(op, dtype)(a, torch.zeros(n, dtype=dtype), out=a)
            finish_avg_(a, op, 2)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        return str(e).splitlines()[0][:120]
    return ""


_FOLDS = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
          ReduceOp.MAX: torch.maximum, ReduceOp.MIN: torch.minimum, ReduceOp.BAND: torch.bitwise_and,
          ReduceOp.BOR: torch.bitwise_or, ReduceOp.BXOR: torch.bitwise_xor}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def combiner(op: ReduceOp, dtype: torch.dtype):
    """The binary torch function that folds ``op`` (called as ``fn(a, b, out=...)``); look it up once per loop.

    Bool follows torch: SUM/MAX are OR, PRODUCT/MIN are AND."""
    if dtype == torch.bool and op not in _BITWISE:
        return torch.logical_or if op in (ReduceOp.SUM, ReduceOp.MAX) else torch.logical_and
    return _FOLDS[op]


def combine_(acc: torch.Tensor, other: torch.Tensor, op: ReduceOp, out: torch.Tensor | None = None) -> torch.Tensor:
    """``acc = op(acc, other)`` in place, or into ``out`` (one pass instead of a copy and a fold)."""
    return combiner(op, acc.dtype)(acc, other, out=acc if out is None else out)


def finish_avg_(t: torch.Tensor, op: ReduceOp, world: int) -> torch.Tensor:
    if op is ReduceOp.AVG and world > 1:
        t.div_(world)
    return t


class ProcessGroup(abc.ABC):
    """A set of ranks that run collectives together. Ranks passed to methods are group-local."""

    def __init__(self, rank: int, size: int, group_name: str = ""):
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside a group of size {size}")
        self._rank, self._size, self.group_name = rank, size, group_name
        self.group_desc = group_name  # torch's free-text label; new_group(group_desc=...) sets it

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    @abc.abstractmethod
    def name(self) -> str:
        """The backend's name ("tcp", "shm", "gloo", ...)."""

    @abc.abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op=ReduceOp.SUM, async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def reduce(self, tensor: torch.Tensor, dst: int = 0, op=ReduceOp.SUM, async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                              async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes=None,
                          input_split_sizes=None, async_op: bool = False) -> Work: ...

    @abc.abstractmethod
    def gather(self, tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int = 0,
               async_op: bool = False) -> Work:
        """Every rank's ``tensor`` into ``gather_list`` on ``dst`` (``None`` elsewhere)."""

    @abc.abstractmethod
    def scatter(self, tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int = 0,
                async_op: bool = False) -> Work:
        """``scatter_list[r]`` on ``src`` into ``tensor`` on rank r (``scatter_list`` is ``None`` elsewhere)."""

    @abc.abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to ``dst``; the Work completes once it is handed to the transport."""

    @abc.abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        """Start receiving into ``tensor`` from ``src``."""

    @abc.abstractmethod
    def barrier(self, async_op: bool = False, device_ids: list[int] | None = None,
                timeout: float | None = None) -> Work:
        """``timeout`` (seconds): this call's own, instead of the group's."""

    def abort(self) -> None:
        """Make operations in flight fail and later ones refuse (torch's ``ProcessGroup.abort``)."""
        raise NotImplementedError(f"backend {self.name()!r} cannot abort")

    def set_timeout(self, seconds: float) -> None:
        """The group's timeout for the operations issued from now on (torch's ``ProcessGroup.set_timeout``)."""
        raise NotImplementedError(f"backend {self.name()!r} cannot change its timeout")

    def shutdown(self) -> None:  # noqa: B027 - optional hook; adapters have nothing to release
        """Release sockets, shared memory and threads."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()} group={self.group_name!r} rank={self._rank}/{self._size}>"
