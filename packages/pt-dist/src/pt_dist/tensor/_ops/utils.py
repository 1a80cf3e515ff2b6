"""The sharding-rule registry (torch's ``tensor/_ops/utils.py`` ``register_op_strategy``, with
``_op_schema.py``'s OpSchema/OutputSharding cut to what a rule needs): a rule sees the op's arguments and the
DTensor arguments' specs, and answers the placements each DTensor argument must have and the placements of the
output(s). Where several layouts would do, ``pick`` takes the one whose redistribution moves the fewest bytes, as
torch's strategies do by cost."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from pt_dist.tensor._dtensor_spec import DTensorSpec
from pt_dist.tensor.placement_types import Placement

__all__ = ["OpCall", "OutputSharding", "pick", "redistribute_cost", "register_prop_rule", "returns_self", "rule_for"]

_RULES: dict = {}


@dataclass
class OpCall:
    """One op call as a rule sees it: the original args/kwargs (DTensors in place), and the specs of the tensor
    arguments in pytree order (a plain scalar tensor appears as a Replicate spec)."""

    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    specs: list[DTensorSpec]
    mesh: object
    plain: list[bool] | None = None  # per spec: a plain one-element tensor (can be read, not redistributed)

    @property
    def mesh_ndim(self) -> int:
        return self.mesh.ndim

    def arg(self, index: int, name: str, default=None):
        """The op's argument at position ``index``, or passed as keyword ``name`` (aten schemas allow both)."""
        return self.args[index] if len(self.args) > index else self.kwargs.get(name, default)


@dataclass
class OutputSharding:
    """Placements per tensor argument (pytree order; None: as it is), and of the output (one tuple, or a list of
    tuples for several outputs)."""

    input_placements: list[tuple[Placement, ...] | None]
    output_placements: tuple[Placement, ...] | list[tuple[Placement, ...] | None] | None
    local_args: tuple | None = None  # the arguments for the local op when they differ (a view's local size)
    local_kwargs: dict | None = None


def register_prop_rule(ops: Iterable) -> Callable:
    """Register ``rule(call) -> OutputSharding`` for every overload of each op (packets expand; out= variants are
    left out: an op without a rule raises)."""

    def wrap(rule):
        for op in ops:
            overloads = [getattr(op, name) for name in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) \
                else [op]
            for ov in overloads:
                if "out" not in ov._overloadname:
                    _RULES[ov] = rule
        return rule

    return wrap


def rule_for(op) -> Callable:
    if op not in _RULES:
        raise NotImplementedError(f"Operator {op} does not have a sharding strategy registered.")
    return _RULES[op]


def redistribute_cost(src: Placement, dst: Placement, numel: int) -> float:
    """Bytes-ish moved to turn ``src`` into ``dst`` on one mesh dim (torch's ``redistribute_cost``, simplified):
    a local chunk is free, a gather or a scatter moves the tensor once, an all-reduce twice."""
    if src == dst or (src.is_replicate() and dst.is_shard()):
        return 0.0
    if src.is_partial() and dst.is_replicate():
        return 2.0 * numel
    if src.is_replicate() and dst.is_partial():
        return 0.5 * numel  # local, but it costs a division and precision: taken only when it saves a collective
    if src.is_shard() and dst.is_partial():
        return float("inf")  # never chosen implicitly
    if src.is_shard() and dst.is_shard():
        return 1.5 * numel  # an all-to-all: dearer than the all-gather it competes with (torch's ranking)
    return 1.0 * numel


def pick(specs: Sequence[DTensorSpec | None], choices: Sequence[tuple], mesh_dim: int) -> tuple:
    """Among ``choices`` (each: one placement per spec, then the output's), the cheapest on ``mesh_dim``; the
    first wins a tie."""
    best, best_cost = None, float("inf")
    for choice in choices:
        cost = 0.0
        for spec, want in zip(specs, choice):
            if spec is not None and want is not None:
                cost += redistribute_cost(spec.placements[mesh_dim], want, spec.tensor_meta.shape.numel())
        if cost < best_cost:
            best, best_cost = choice, cost
    if best is None:
        raise RuntimeError(f"no sharding on mesh dim {mesh_dim} fits {[s and str(s) for s in specs]}")
    return best



@functools.cache
def returns_self(op) -> bool:
    """An in-place op (``add_``, ``copy_``): its first return aliases, and writes, its first argument."""
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and rets[0].alias_info.is_write
