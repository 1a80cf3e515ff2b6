"""FSDP2 and autograd (issue 33), after torch's test/distributed/_composable/fsdp/test_fully_shard_autograd.py:
``test_unused_forward_output`` (a forward output left out of the loss in later steps), ``test_unused_forward_module``
(a ``fully_shard`` module that never runs forward: its group is finished by the root's final callback), and
``test_nontensor_activations`` (activations inside a list, tuple, namedtuple or dict, through parameterless
``fully_shard`` modules), each with and without ``reshard_after_forward``. Side by side with torch's
``fully_shard`` on gloo in the same ranks: loss, every gradient and every parameter after ``Adam(foreach=False)``
bit for bit (torch's own test compares against a replicated model instead)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_fully_shard_common import Compare, side_by_side, train_compare, two_worlds  # noqa: E402

DIM = 6
NT = collections.namedtuple("NT", "x y")


class DoubleLinear(nn.Module):
    """torch's common_fsdp.DoubleLinear: two outputs, or one with ``use_second_linear=False``."""

    def __init__(self, use_second_linear: bool):
        super().__init__()
        self.lin1, self.lin2, self.use_second_linear = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM - 1), use_second_linear

    def forward(self, x):
        if self.use_second_linear:
            return torch.relu(self.lin1(x)), torch.relu(self.lin2(x))
        return torch.relu(self.lin1(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, inp):
        f = lambda x: torch.relu(self.lin2(torch.relu(self.lin1(x))))  # noqa: E731
        if isinstance(inp, list):
            return [f(inp[0])]
        if isinstance(inp, NT):
            return NT(f(inp.x), inp.y)
        if isinstance(inp, tuple):
            return (f(inp[0]),)
        return {"x": f(inp["x"])}


class ToContainer(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return {"list": lambda: [x], "tuple": lambda: (x,), "namedtuple": lambda: NT(x, torch.ones_like(x)),
                "dict": lambda: {"x": x}}[self.kind]()


class FromContainer(nn.Module):
    def forward(self, c):
        return c["x"] if isinstance(c, dict) else c[0]


def _unused_output(rab):
    def shard(model, fully_shard, mesh):
        fully_shard(model.lin1, mesh=mesh, reshard_after_forward=rab)
        fully_shard(model, mesh=mesh, reshard_after_forward=rab)
    return (lambda: DoubleLinear(True)), shard, lambda out, step: ((out[0][:, :-1] * out[1]).sum() if step < 1
                                                                  else out[0].sum())


def _unused_module(rab):
    def shard(model, fully_shard, mesh):
        for m in (model.lin1, model.lin2, model):  # lin2 never runs forward
            fully_shard(m, mesh=mesh, reshard_after_forward=rab)
    return (lambda: DoubleLinear(False)), shard, lambda out, step: out.sum()


def _containers(kind):
    def build():
        return nn.Sequential(ToContainer(kind), Block(), Block(), FromContainer())

    def shard(model, fully_shard, mesh):
        for m in model:
            fully_shard(m, mesh=mesh)  # the container modules have no parameters: states without a group
        fully_shard(model, mesh=mesh)
    return build, shard, lambda out, step: out.sum()


CONFIGS = {
    **{f"unused_forward_output_reshard_{r}": _unused_output(r) for r in (True, False)},
    **{f"unused_forward_module_reshard_{r}": _unused_module(r) for r in (True, False)},
    **{f"nontensor_activations_{k}": _containers(k) for k in ("list", "tuple", "namedtuple", "dict")},
}


def _parity(rank, world):
    out = {}
    with two_worlds(rank, world, "fs_autograd"):
        for name, (build, shard, loss) in CONFIGS.items():
            theirs, ours = side_by_side(build, shard)
            batch = lambda step, mb: torch.rand(2, DIM, generator=torch.Generator().manual_seed(rank * 10 + step))  # noqa: E731
            out[name] = train_compare(Compare(f"{name} rank {rank}"), theirs, ours, batch, steps=3, loss=loss)
    return out


@pytest.fixture(scope="module")
def parity():
    return run_ranks(_parity, 2, backend=None, timeout=240)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_autograd_matches_torch_fully_shard(parity, config):
    for fails, count in (r[config] for r in parity):
        assert count > 15 and not fails, fails[:5]
