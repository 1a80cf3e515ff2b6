"""The three placements of a DTensor on one mesh dim (torch's ``torch/distributed/tensor/placement_types.py``):
``Shard(dim)`` (torch.chunk of tensor dim ``dim``: the last ranks may be short or empty), ``Replicate()`` and
``Partial(reduce_op)`` (each rank holds a term of a pending reduction). Frozen values with torch's equality,
hash, ``repr`` and ``str``; the collectives that move between them are in ``_redistribute.py``."""

from __future__ import annotations

from pt_dist.tensor._collective_utils import mesh_all_reduce, mesh_reduce_scatter

__all__ = ["Placement", "Shard", "Replicate", "Partial"]

_REDUCE_OPS = ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")


class Placement:
    """Base of the placements (torch's ``Placement``)."""

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")


class Shard(Placement):
    """Tensor dim ``dim`` split as ``torch.chunk`` over the mesh dim."""

    __slots__ = ("dim",)

    def __init__(self, dim: int) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"Shard(dim): dim must be an int, got {dim!r}")
        object.__setattr__(self, "dim", dim)

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other: object) -> bool:
        return type(other) is Shard and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(self.dim)

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"

    def __reduce__(self):
        return Shard, (self.dim,)

    @staticmethod
    def local_shard_size_and_offset(curr_local_size: int, num_chunks: int, rank: int) -> tuple[int, int]:
        """(length, start) of chunk ``rank`` of ``num_chunks`` of a dim of ``curr_local_size``, as ``torch.chunk``."""
        full = -(-curr_local_size // num_chunks)
        start = min(curr_local_size, full * rank)
        return max(0, min(curr_local_size, start + full) - start), start


class Replicate(Placement):
    """Every rank of the mesh dim holds the whole tensor."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return type(other) is Replicate

    def __hash__(self) -> int:
        return -1  # every replicate placement is the same (torch's)

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"

    def __reduce__(self):
        return Replicate, ()


class Partial(Placement):
    """Each rank holds a term; the tensor is their ``reduce_op`` ("sum", "avg", "min", "max", ...)."""

    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op: str | None = "sum") -> None:
        reduce_op = "sum" if reduce_op is None else reduce_op
        if reduce_op not in _REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): expected one of {_REDUCE_OPS}")
        object.__setattr__(self, "reduce_op", reduce_op)

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partial) and type(other) is type(self) and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return 1 + hash(self.reduce_op)

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"

    def __reduce__(self):
        return type(self), (self.reduce_op,)

    # the reduction contract (torch's): what Partial -> Replicate / Shard and Replicate -> Partial do locally
    def _reduce_value(self, tensor, mesh, mesh_dim: int):
        return mesh_all_reduce(tensor, self.reduce_op, mesh, mesh_dim)

    def _reduce_shard_value(self, tensor, mesh, mesh_dim: int, shard_spec: Shard):
        return mesh_reduce_scatter(tensor, self.reduce_op, shard_spec.dim, mesh, mesh_dim)

    def _partition_value(self, tensor, mesh, mesh_dim: int):
        if self.reduce_op == "sum":
            return tensor / mesh.size(mesh_dim)
        if self.reduce_op in ("avg", "min", "max"):
            return tensor
        raise ValueError(f"Replicate to Partial({self.reduce_op}) conversion is not supported.")
