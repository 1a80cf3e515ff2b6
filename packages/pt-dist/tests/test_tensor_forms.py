"""Tensors in the forms users hand to collectives, and torch's list and sparse forms of the collectives.

Lazy ``.conj()`` and negative views (their bytes are not their values), 0-dim tensors, the bitwise
reduce ops, ``all_to_all`` / ``reduce_scatter`` with lists (unequal shapes in all-to-all), the ``*_coalesced``
pair and ``gather_single``, and sparse COO all-reduce (DDP's sparse embedding gradients), on tcp, shm and the
gloo adapter, against results computed locally (and on gloo against torch's own in the same ranks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError, ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402
from ptdist_testutil import reference  # noqa: E402

BACKENDS = ["tcp", "shm", "gloo"]


def _values(rank: int, n: int, salt: int = 0) -> torch.Tensor:
    return ((torch.arange(n) * (rank + 3) + salt) % 7 - 3).to(torch.float32) * 0.5


def _complex(rank: int, n: int) -> torch.Tensor:
    return torch.complex(_values(rank, n, 1), _values(rank, n, 2))


def _neg_view(x: torch.Tensor) -> torch.Tensor:
    """A view whose values are ``x`` while its memory holds ``-x`` (what ``.conj().imag`` returns)."""
    v = torch.complex(torch.zeros_like(x), -x).conj().imag
    assert v.is_neg() and torch.equal(v, x)
    return v


def _lazy_views(rank, ws, backend):
    util.join(rank, ws, backend, key=f"lazy-{backend}")
    check = util.Checks(f"{backend} rank={rank}")
    try:
        for n in (7, 70_000):  # shm: the one-barrier small path; the single-copy (complex) and staged paths
            zs = [_complex(r, n) for r in range(ws)]
            for op in [ReduceOp.SUM] + ([ReduceOp.PRODUCT] if backend != "gloo" else []):
                t = zs[rank].clone().conj()
                pt_dist.all_reduce(t, op=op)
                check(f"all_reduce {op.name} conj n={n}", t, reference([z.conj() for z in zs], op))
                assert t.is_conj()
            xs = [_values(r, n, 3) for r in range(ws)]
            for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN):
                t = _neg_view(xs[rank].clone())
                pt_dist.all_reduce(t, op=op)
                check(f"all_reduce {op.name} neg n={n}", t, reference(xs, op))
            out = torch.zeros(ws * n, dtype=torch.complex64).conj()
            pt_dist.all_gather_into_tensor(out, zs[rank].clone().conj())
            check(f"all_gather conj n={n}", out, torch.cat([z.conj() for z in zs]))
            t = torch.zeros(n, dtype=torch.complex64).conj()
            pt_dist.broadcast(t.copy_(zs[rank].conj()) if rank == 1 else t, src=1)
            check(f"broadcast into conj n={n}", t, zs[1].conj())
            wide = [_values(r, ws * n, 4) for r in range(ws)]
            out = _neg_view(torch.zeros(n))
            pt_dist.reduce_scatter_tensor(out, _neg_view(wide[rank].clone()), op=ReduceOp.MAX)
            check(f"reduce_scatter neg n={n}", out, reference([w.view(ws, n)[rank] for w in wide], ReduceOp.MAX))
            if rank == 0:
                pt_dist.send(zs[0].clone().conj(), dst=1)
            elif rank == 1:
                t = torch.zeros(n, dtype=torch.complex64).conj()
                pt_dist.recv(t, src=0)
                check(f"recv into conj n={n}", t, zs[0].conj())
        t = torch.tensor(float(rank + 1))
        pt_dist.all_reduce(t)
        check("all_reduce 0-dim", t, torch.tensor(ws * (ws + 1) / 2))
        assert check.count and not check.fails, "\n".join(check.fails)
    finally:
        util.leave()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lazy_views_and_scalars(backend):
    """A ``.conj()`` view all-reduced in place on tcp mixed the view's values with peers' raw bytes; shm's
    MAX/MIN/PRODUCT on a negative view compared raw bytes. Both now move the values, and write them back."""
    run_ranks(_lazy_views, 3, backend, backend=None, timeout=120)


def _lists(rank, ws, backend):
    util.join(rank, ws, backend, key=f"lists-{backend}")
    try:
        rows = lambda i, j: (i + 2 * j) % 3  # noqa: E731 - rows rank i sends rank j (some zero)
        block = lambda i, j: torch.arange(rows(i, j) * 2, dtype=torch.float64).view(-1, 2) + 100 * i + 10 * j  # noqa: E731
        for async_op in (False, True):
            outs = [torch.full((rows(j, rank), 2), -1.0, dtype=torch.float64) for j in range(ws)]
            outs[0] = torch.full((2, rows(0, rank)), -1.0, dtype=torch.float64).t()  # a non-contiguous output
            work = pt_dist.all_to_all(outs, [block(rank, j) for j in range(ws)], async_op=async_op)
            if async_op:
                work.wait()
                assert work.result() == outs
            for j in range(ws):
                assert torch.equal(outs[j], block(j, rank)), (backend, rank, j, outs[j])
            ins = [torch.full((2, 3), float(rank * 10 + i)) for i in range(ws)]
            out = torch.empty(2, 3)
            work = pt_dist.reduce_scatter(out, ins, op=ReduceOp.MAX, async_op=async_op)
            if async_op:
                work.wait()
            assert torch.equal(out, torch.full((2, 3), float((ws - 1) * 10 + rank))), (backend, rank, out)
        pt_dist.barrier(device_ids=[0])  # what NCCL scripts pass; CPU backends take it too
        with pytest.raises(ValueError, match="device_ids must be a list of ints"):
            pt_dist.barrier(device_ids=0)
        with pytest.raises(ValueError, match="input_tensor_list must be a list of group size"):
            pt_dist.all_to_all([torch.zeros(1)] * ws, [torch.zeros(1)] * (ws + 1))
        with pytest.raises(ValueError, match=r"input_list\[0\] is torch.float64, expected torch.float32 like the outp"):
            pt_dist.reduce_scatter(torch.zeros(2), [torch.zeros(2, dtype=torch.float64)] * ws)
        with pytest.raises(ValueError, match=r"output_tensor_list\[0\] is torch.float32, expected torch.float64 like "
                                             r"input_tensor_list"):
            pt_dist.all_to_all([torch.zeros(1)] * ws, [torch.zeros(1, dtype=torch.float64)] * ws)
        # (blocks may differ in size from rank to rank, as gloo's: test_c10d_upstream.py; not from this rank's output)
        with pytest.raises(ValueError, match=rf"input_list\[{rank}\] \(this rank's block\) has 3 elements, output"):
            pt_dist.reduce_scatter(torch.zeros(2), [torch.zeros(3)] * ws)
        if backend != "gloo":  # rank 0 expects one row too many from rank 1: every rank raises, the group goes on
            outs = [torch.zeros(rows(j, rank) + (rank == 0 and j == 1), 2, dtype=torch.float64) for j in range(ws)]
            with pytest.raises(DistError, match="rank 1 sends"):
                pt_dist.all_to_all(outs, [block(rank, j) for j in range(ws)])
            t = torch.ones(2)
            pt_dist.all_reduce(t)
            assert t.tolist() == [ws, ws]
    finally:
        util.leave()


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_all_to_all_and_reduce_scatter(backend):
    run_ranks(_lists, 3, backend, backend=None, timeout=120)


def _sparse_local(rank: int, hybrid: bool) -> torch.Tensor:
    """Rank 2 holds nothing; rank 1's indices repeat (uncoalesced); ranks overlap at index 4."""
    idx = {0: [[1, 4]], 1: [[4, 7, 4]], 2: [[]]}[rank]
    n = len(idx[0])
    vals = torch.arange(1, n * 3 + 1, dtype=torch.float32).view(n, 3) * (rank + 1) if hybrid else \
        torch.arange(1, n + 1, dtype=torch.float32) * (rank + 1)
    return torch.sparse_coo_tensor(torch.tensor(idx, dtype=torch.int64).view(1, n), vals, (9, 3) if hybrid else (9,))


def _sparse(rank, ws, backend):
    util.join(rank, ws, backend, key=f"sparse-{backend}")
    try:
        for hybrid in (False, True):
            for async_op in (False, True):
                s = _sparse_local(rank, hybrid)
                work = pt_dist.all_reduce(s, async_op=async_op)
                if async_op:
                    work.wait()
                want = sum(_sparse_local(r, hybrid).to_dense() for r in range(ws))
                assert s.is_sparse and s.is_coalesced(), (backend, s)
                assert torch.equal(s.to_dense(), want), (backend, rank, hybrid, s.to_dense(), want)
        with pytest.raises(ValueError, match="ReduceOp.SUM only"):
            pt_dist.all_reduce(_sparse_local(rank, False), op=ReduceOp.MAX)
        with pytest.raises(ValueError, match="sparse_csr"):
            pt_dist.all_reduce(torch.eye(3).to_sparse_csr())
        with pytest.raises(ValueError, match="needs an integer or bool dtype, got torch.float32"):
            pt_dist.all_reduce(torch.ones(2), op=ReduceOp.BXOR)
        t = torch.tensor([rank, 1])
        pt_dist.all_reduce(t, op="bor")  # names work as for every op
        assert t.tolist() == [3, 1]
    finally:
        util.leave()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_all_reduce_sums_the_union_in_place(backend):
    run_ranks(_sparse, 3, backend, backend=None, timeout=120)


def _coalesced(rank, ws, backend):
    import torch.distributed as dist

    util.join(rank, ws, backend, key=f"coalesced-{backend}")
    try:
        def inputs():  # a transposed (non-contiguous) matrix, a vector, an empty tensor: one dtype
            return [_values(rank, 12).view(3, 4).t(), _values(rank, 5, salt=1), torch.empty(0)]
        for async_op in (False, True):
            ts = inputs()
            fut = pt_dist.all_reduce_coalesced(ts, ReduceOp.SUM, async_op=async_op)
            if async_op:  # torch's hands back a Future here, not a Work
                assert isinstance(fut, torch.futures.Future) and fut.wait() is not None
            else:
                assert fut is None
            for got, parts in zip(ts, zip(*[[_values(r, 12).view(3, 4).t(), _values(r, 5, salt=1), torch.empty(0)]
                                            for r in range(ws)])):
                assert torch.equal(got, reference(list(parts), ReduceOp.SUM)), (backend, got)
            outs = [[torch.empty(4, 3), torch.empty(5), torch.empty(0)] for _ in range(ws)]
            fut = pt_dist.all_gather_coalesced(outs, inputs(), async_op=async_op)
            if async_op:
                fut.wait()
            for r in range(ws):
                assert torch.equal(outs[r][0], _values(r, 12).view(3, 4).t()) and torch.equal(
                    outs[r][1], _values(r, 5, salt=1)), (backend, r, outs[r])
        if backend == "gloo":  # torch's own on the same ranks, call for call
            theirs = inputs()
            dist.all_reduce_coalesced(theirs)
            ours = inputs()
            pt_dist.all_reduce_coalesced(ours)
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs))

        def states(r):  # DDP's module states: mixed dtypes, a 0-dim counter, a transposed view, a parameter
            return [torch.full((3,), r + 0.5), torch.arange(5) * (r + 1), torch.tensor(r, dtype=torch.int64),
                    torch.arange(4.0).view(2, 2).t() * r, torch.nn.Parameter(torch.full((6,), float(r))),
                    torch.empty(0, dtype=torch.float16)]
        for size in (16, 1 << 20):  # one tensor or several per buffer
            ours = states(rank)
            pt_dist._broadcast_coalesced(pt_dist.group.WORLD, ours, size, ws - 1)
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, states(ws - 1))), (size, ours)
            if backend == "gloo":
                theirs = states(rank)
                with torch.no_grad():  # (torch's refuses to write a parameter otherwise; ours writes it under no_grad)
                    dist._broadcast_coalesced(dist.group.WORLD, theirs, size, ws - 1)
                assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
        assert pt_dist.barrier(async_op=True).get_future().wait() == []  # as torch's barrier future
        got = [torch.empty(2) for _ in range(ws)] if rank == 0 else None
        value = pt_dist.gather(torch.full((2,), float(rank)), got, dst=0, async_op=True).get_future().wait()
        if rank == 0:
            assert [v.tolist() for v in value] == [[float(j)] * 2 for j in range(ws)]
        else:
            assert value == [], value  # as torch's gloo (it held the input off the root)
        with pytest.raises(ValueError, match=r"tensors\[1\] is torch.int64, expected torch.float32"):
            pt_dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.int64)])
        with pytest.raises(RuntimeError, match=r"invalid size of output tensor at index 0 \(output_tensor_lists"
                                               r"\[0\]\[0\] has 2 elements, input 3\)"):  # gloo's class and words
            pt_dist.all_gather_coalesced([[torch.empty(2)]] * ws, [torch.ones(3)])
        mine = torch.full((2, 3), float(rank))
        for shape in ((ws * 2, 3), (ws, 2, 3)):  # flat or stacked: only the element count matters
            out = torch.full(shape, -1.0) if rank == 1 else None
            work = pt_dist.gather_single(mine, out, group_dst=1, async_op=True)
            work.wait()
            if rank == 1:
                assert torch.equal(out.reshape(ws, 2, 3), torch.arange(ws, dtype=torch.float32).view(ws, 1, 1)
                                   .expand(ws, 2, 3)), out
        gathered = torch.empty(ws * 2)
        pt_dist.all_gather_single(gathered, torch.full((2,), float(rank)))  # torch 2.15's names
        part = torch.empty(2)
        pt_dist.reduce_scatter_single(part, torch.ones(ws * 2))
        assert gathered.tolist() == [float(r) for r in range(ws) for _ in range(2)] and part.tolist() == [ws] * 2
        assert pt_dist.gather_into_tensor is pt_dist.gather_single
    finally:
        util.leave()


@pytest.mark.parametrize("backend", BACKENDS)
def test_coalesced_collectives_and_gather_into_one_tensor(backend):
    run_ranks(_coalesced, 3, backend, backend=None, timeout=120)


def _aliased(rank, ws, backend):
    """Outputs that share memory with inputs other than as NCCL's in-place blocks: gloo reads its inputs into
    buffers of its own first, so these work there; the native backends refused them on only some ranks (block 0
    is the in-place block of rank 0 alone), leaving the others to wait for a collective that never came."""
    util.join(rank, ws, backend, key=f"aliased-{backend}")
    try:
        n, out = 3, {}
        inp = torch.arange(ws * n, dtype=torch.float64) + 100 * rank
        want = sum(torch.arange(ws * n, dtype=torch.float64) + 100 * r for r in range(ws))
        pt_dist.reduce_scatter_tensor(inp[:n], inp)  # every rank's output is block 0 of its input
        out["reduce_scatter"] = torch.equal(inp[:n], want[rank * n:(rank + 1) * n])
        gathered = torch.zeros(ws * n, dtype=torch.float64)
        gathered[:n] = torch.arange(n) + 10.0 * rank
        pt_dist.all_gather_into_tensor(gathered, gathered[:n])  # every rank's input is block 0 of its output
        out["all_gather"] = gathered.tolist() == [10.0 * r + i for r in range(ws) for i in range(n)]
        mine = torch.full((n,), float(rank))
        bufs = [torch.zeros(n) for _ in range(ws)] if rank == 0 else None
        if rank == 0:
            bufs[0] = mine  # the root's own block is its input
        pt_dist.gather(mine, bufs, dst=0)
        out["gather"] = rank != 0 or [b.tolist() for b in bufs] == [[float(r)] * n for r in range(ws)]
        piece = torch.full((n,), -1.0)
        pieces = [piece] + [torch.full((n,), float(r)) for r in range(1, ws)] if rank == 0 else None
        if rank == 0:
            piece.fill_(0.0)  # the root's output is its own piece
        pt_dist.scatter(piece, pieces, src=0)
        out["scatter"] = piece.tolist() == [float(rank)] * n
        return out
    finally:
        util.leave()


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_aliasing_inputs_outside_the_in_place_forms_work_on_every_rank(backend):
    assert run_ranks(_aliased, 3, backend, backend=None, timeout=120) == [
        {"reduce_scatter": True, "all_gather": True, "gather": True, "scatter": True}] * 3
