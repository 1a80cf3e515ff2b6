"""pt_dist.nn.functional: forward results and gradients of the autograd-aware collectives.

Each rank's loss weighs the collective's output with rank-dependent weights; the gradient every rank gets for
its input is the derivative of the sum of all ranks' losses, worked out by hand below. On gloo, torch's own
torch.distributed.nn.functional runs in the same ranks on the same inputs and must agree, value and gradient.
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed
import torch.distributed.nn.functional as torch_functional
from pt_dist.nn import functional as F

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402

N = 6  # elements per rank (divisible by the world size, 3)


def _x(r: int) -> torch.Tensor:
    return (torch.arange(N, dtype=torch.float64) + 1) * (r + 1)


def _c(r: int, salt: int = 0) -> torch.Tensor:
    return torch.arange(N, dtype=torch.float64) * 0.5 + r + 10 * salt


def _run(lib, name: str, rank: int, ws: int):
    """(forward output, gradient of the input) of one collective under ``lib`` (ours or torch's)."""
    if name == "all_reduce":
        x = _x(rank).requires_grad_()
        y = lib.all_reduce(x)
        (y * _c(rank)).sum().backward()
        return y.detach(), x.grad
    if name == "all_gather":
        x = _x(rank).requires_grad_()
        ys = lib.all_gather(x)
        sum((y * _c(rank, i)).sum() for i, y in enumerate(ys)).backward()
        return torch.stack([y.detach() for y in ys]), x.grad
    if name == "reduce_scatter":
        ins = [(_x(rank) + i).requires_grad_() for i in range(ws)]
        y = lib.reduce_scatter(out := torch.empty(N, dtype=torch.float64), ins)
        assert torch.equal(out, y.detach())  # torch's write into the output passed in (ours once did not)
        (y * _c(rank)).sum().backward()
        return y.detach(), torch.stack([t.grad for t in ins])
    if name == "broadcast":
        x = _x(rank).requires_grad_()
        y = lib.broadcast(x, src=1)
        (y * _c(rank)).sum().backward()
        return y.detach(), x.grad
    if name == "reduce":
        x = _x(rank).requires_grad_()
        y = lib.reduce(x, 1)
        (y * _c(rank)).sum().backward()
        return (y.detach() if rank == 1 else None), x.grad  # only the destination's output is defined
    if name == "gather":
        x = _x(rank).requires_grad_()
        ys = lib.gather(x, dst=1)
        sum((y * _c(rank, i)).sum() for i, y in enumerate(ys)).backward()
        return torch.stack([y.detach() for y in ys]), x.grad
    if name == "scatter":
        ins = [(_x(rank) + i).requires_grad_() for i in range(ws)]
        y = lib.scatter(ins, src=1)
        (y * _c(rank)).sum().backward()
        return y.detach(), torch.stack([t.grad for t in ins])
    if name == "all_to_all":
        ins = [(_x(rank) + j).requires_grad_() for j in range(ws)]
        ys = lib.all_to_all(outs := [torch.empty(N, dtype=torch.float64) for _ in range(ws)], ins)
        assert all(torch.equal(o, y.detach()) for o, y in zip(outs, ys))
        sum((y * _c(rank, j)).sum() for j, y in enumerate(ys)).backward()
        return torch.stack([y.detach() for y in ys]), torch.stack([t.grad for t in ins])
    if name.startswith("all_to_all_single "):  # rank r sends r+1 rows to each rank / receives r+1 from each
        size = [r + 1 for r in range(ws)]
        out_only = name.endswith("output splits")
        x = _rows(rank, ws * size[rank] if out_only else sum(size)).requires_grad_()
        out = torch.empty(sum(size) if out_only else ws * size[rank], dtype=torch.float64)
        y = (lib.all_to_all_single(out, x, output_split_sizes=size) if out_only else
             lib.all_to_all_single(out, x, input_split_sizes=size))
        assert torch.equal(out, y.detach())
        (y * _rows(rank, out.numel(), weights=True)).sum().backward()
        return y.detach(), x.grad
    x = _x(rank).requires_grad_()  # all_to_all_single, even splits
    y = lib.all_to_all_single(out := torch.empty(N, dtype=torch.float64), x)
    assert torch.equal(out, y.detach())
    (y * _c(rank)).sum().backward()
    return y.detach(), x.grad


def _rows(r: int, n: int, weights: bool = False) -> torch.Tensor:
    """Rank r's input of n rows (or its loss's weights for n output rows), for the uneven all-to-alls."""
    i = torch.arange(n, dtype=torch.float64)
    return i * 0.5 + r if weights else (i + 1) * (r + 1)


OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single", "reduce", "gather", "scatter",
       "all_to_all", "all_to_all_single output splits", "all_to_all_single input splits"]


def _expected(name: str, rank: int, ws: int):
    """Forward result on ``rank`` and the gradient of the sum of every rank's loss with respect to its input."""
    b = N // ws
    if name == "all_reduce":
        return sum(_x(r) for r in range(ws)), sum(_c(r) for r in range(ws))
    if name == "all_gather":
        return torch.stack([_x(r) for r in range(ws)]), sum(_c(r, rank) for r in range(ws))
    if name == "reduce_scatter":
        return sum(_x(r) + rank for r in range(ws)), torch.stack([_c(i) for i in range(ws)])
    if name == "broadcast":
        return _x(1), sum(_c(r) for r in range(ws)) if rank == 1 else torch.zeros(N, dtype=torch.float64)
    zeros = torch.zeros(N, dtype=torch.float64)
    if name == "reduce":  # every input fed the destination's sum once
        return (sum(_x(r) for r in range(ws)) if rank == 1 else None), _c(1)
    if name == "gather":  # zeros off the root, as torch's
        return (torch.stack([_x(r) for r in range(ws)]) if rank == 1 else torch.zeros(ws, N, dtype=torch.float64),
                _c(1, rank))
    if name == "scatter":
        return _x(1) + rank, torch.stack([_c(i) for i in range(ws)]) if rank == 1 else torch.stack([zeros] * ws)
    if name == "all_to_all":
        return torch.stack([_x(j) + rank for j in range(ws)]), torch.stack([_c(j, rank) for j in range(ws)])
    size = [r + 1 for r in range(ws)]
    off = [sum(size[:r]) for r in range(ws)]
    if name == "all_to_all_single output splits":  # rank j's input: ws blocks of size[j]; my output: block j's
        out = torch.cat([_rows(j, ws * size[j])[rank * size[j]:(rank + 1) * size[j]] for j in range(ws)])
        grad = torch.cat([_rows(j, sum(size), weights=True)[off[rank]:off[rank] + size[rank]] for j in range(ws)])
        return out, grad  # (block j of my input went to rank j, after the blocks of the ranks before me)
    if name == "all_to_all_single input splits":  # every input: blocks of size[0], size[1], ...
        out = torch.cat([_rows(j, sum(size))[off[rank]:off[rank] + size[rank]] for j in range(ws)])
        grad = torch.cat([_rows(j, ws * size[j], weights=True)[rank * size[j]:(rank + 1) * size[j]]
                          for j in range(ws)])
        return out, grad
    out = torch.cat([_x(j)[rank * b:(rank + 1) * b] for j in range(ws)])
    grad = torch.cat([_c(k)[rank * b:(rank + 1) * b] for k in range(ws)])
    return out, grad


def _autograd(rank, ws, backend):
    util.join(rank, ws, backend, key=f"autograd-{backend}")
    libs = {"ours": F}
    if backend == "gloo":  # torch's defaults are ``group=group.WORLD`` as it was when the module was first imported
        # (a pooled rank process may have imported it under an earlier job's group): pass today's explicitly
        world = torch.distributed.group.WORLD
        libs["torch"] = types.SimpleNamespace(**{name: functools.partial(getattr(torch_functional, name), group=world)
                                                 for name in OPS if " " not in name})
    got = {(lib, name): _run(mod, name, rank, ws) for name in OPS for lib, mod in libs.items()}
    with pytest.raises(ValueError, match="autograd supports ReduceOp.SUM and AVG"):
        F.all_reduce(torch.ones(2, requires_grad=True), op=pt_dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="reduce: autograd supports ReduceOp.SUM, got ReduceOp.MAX"):
        F.reduce(torch.ones(2, requires_grad=True), 0, op="max")
    with pytest.raises(ValueError, match=r"scatter: the tensors must share one shape, got \[\[2\], \[3\]\]"):
        F.scatter([torch.ones(2), torch.ones(3)])
    util.leave()
    return got


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_gradients_flow_back_through_collectives(backend):
    ws = 3
    for rank, got in enumerate(run_ranks(_autograd, ws, backend, backend=None, timeout=120)):
        for name in OPS:
            out, grad = got[("ours", name)]
            want_out, want_grad = _expected(name, rank, ws)
            assert (out is want_out is None) or torch.equal(out, want_out), (backend, rank, name, "forward")
            assert torch.equal(grad, want_grad), (backend, rank, name, grad, want_grad)
            if ("torch", name) in got:  # torch.distributed.nn.functional, same ranks, same inputs
                assert all(a is b is None or torch.equal(a, b) for a, b in zip(got[("torch", name)], (out, grad))), \
                    (rank, name, got[("torch", name)], (out, grad))
