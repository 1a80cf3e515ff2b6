"""Symmetric memory on shm groups: collective allocation, direct-access all-reduce, agreement and limits."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError, ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _values(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


def _symmetric(rank, world_size):
    before = set(util.open_segments())  # a pooled rank may still hold an earlier job's; only this job's count
    util.join(rank, world_size, "shm", key="symm")
    out = {}
    # odd sizes (slices of unequal length, chunks cut short), 2-D shapes, several dtypes and ops
    for n, dtype, op in [((1 << 18) + 7, torch.float32, ReduceOp.SUM), (3 * 5 * 7, torch.float64, ReduceOp.MAX),
                         ((1 << 17) + 1, torch.int64, ReduceOp.MIN), (1001, torch.float32, ReduceOp.AVG),
                         (1, torch.float32, ReduceOp.SUM)]:
        t = pt_dist.symmetric_empty(n, dtype=dtype)
        t.copy_(_values(rank, n, dtype))
        pt_dist.all_reduce(t, op=op)
        out[(n, str(dtype), op.name)] = t.clone()
    m = pt_dist.symmetric_empty(6, 7)
    m.fill_(rank + 1.0)
    pt_dist.all_reduce(m)
    out["matrix"] = m.clone()
    # a symmetric tensor on one rank and a plain one on another: every rank raises, the group goes on
    sym = pt_dist.symmetric_empty(4096)
    try:
        pt_dist.all_reduce(sym if rank == 0 else torch.zeros(4096))
        out["mismatch"] = None
    except DistError as e:
        out["mismatch"] = str(e)
    ok = torch.ones(5)
    pt_dist.all_reduce(ok)
    out["after"] = ok.tolist()
    out.update(_gather_scatter_broadcast(rank, world_size))
    with pytest.raises(ValueError, match="do not fit"):
        pt_dist.symmetric_empty(1 << 40, dtype=torch.uint8)
    tcp = pt_dist.new_group(list(range(world_size)), backend="tcp")
    with pytest.raises(ValueError, match="needs an 'shm' group"):
        pt_dist.symmetric_empty(4, group=tcp)
    util.leave()
    del t, m, sym
    gc.collect()
    # the heap's descriptor once stayed open: its pages stayed held
    out["segments left"] = [s for s in util.open_segments() if s not in before]
    return out


GATHER_SIZES = [((1 << 16) + 3, torch.float32), (5, torch.int64), (1, torch.float64)]


def _gather_scatter_broadcast(rank, world_size):
    """FSDP's pair and broadcast on symmetric inputs (read where they lie; outputs are plain tensors)."""
    pg, calls = pt_dist.GroupMember.WORLD, []

    def spy(name, fn):
        return lambda *a: (calls.append(name), fn(*a))[1]
    for name in ("all_gather", "reduce_scatter", "broadcast"):  # count the path taken
        setattr(pg.symmetric, name, spy(f"symmetric.{name}", getattr(pg.symmetric, name)))
    out = {}
    for n, dtype in GATHER_SIZES:
        x = pt_dist.symmetric_empty(n, dtype=dtype)
        x.copy_(_values(rank, n, dtype))
        gathered = torch.empty(world_size * n, dtype=dtype)
        pt_dist.all_gather_into_tensor(gathered, x)
        pieces = [torch.empty(n, dtype=dtype) for _ in range(world_size)]
        pt_dist.all_gather(pieces, x)
        out[f"gather {n}"] = (gathered, torch.cat(pieces))
        wide = pt_dist.symmetric_empty(world_size, n, dtype=dtype)
        wide.copy_(_values(rank, world_size * n, dtype).view(world_size, n))
        for op in (ReduceOp.SUM, ReduceOp.MAX) + ((ReduceOp.AVG,) if dtype.is_floating_point else ()):
            o = torch.empty(n, dtype=dtype)
            pt_dist.reduce_scatter_tensor(o, wide, op=op)
            out[f"scatter {n} {op.name}"] = o
        pt_dist.broadcast(x, src=world_size - 1)
        out[f"broadcast {n}"] = x.clone()
    # FSDP's in-place all-gather: each rank's input is its own block of a symmetric output, so the inputs sit
    # at different heap offsets on different ranks
    flat = pt_dist.symmetric_empty(world_size * 1000)
    mine = flat[rank * 1000:(rank + 1) * 1000]
    mine.copy_(_values(rank, 1000, torch.float32))
    pt_dist.all_gather_into_tensor(flat, mine)
    out["in-place gather"] = flat.clone()
    wide = pt_dist.symmetric_empty(world_size * 1000)  # and in-place reduce-scatter: output = my block of it
    wide.copy_(_values(rank, world_size * 1000, torch.float32))
    pt_dist.reduce_scatter_tensor(wide[rank * 1000:(rank + 1) * 1000], wide)
    out["in-place scatter"] = wide[rank * 1000:(rank + 1) * 1000].clone()
    out["calls"] = sorted(set(calls)), len(calls)
    sym = pt_dist.symmetric_empty(8)
    try:  # symmetric on one rank only: the header says so, every rank raises, the group goes on
        pt_dist.all_gather_into_tensor(torch.empty(8 * world_size), sym if rank == 0 else torch.zeros(8))
        out["gather mismatch"] = None
    except DistError as e:
        out["gather mismatch"] = str(e)
    for name in ("all_gather", "reduce_scatter", "broadcast"):
        delattr(pg.symmetric, name)
    return out


def _check_gather_scatter_broadcast(results, ws):
    for n, dtype in GATHER_SIZES:
        inputs = [_values(r, n, dtype) for r in range(ws)]
        wides = torch.stack([_values(r, ws * n, dtype).double() for r in range(ws)])
        for rank, res in enumerate(results):
            assert all(torch.equal(g, torch.cat(inputs)) for g in res[f"gather {n}"]), (n, rank)
            assert torch.equal(res[f"broadcast {n}"], inputs[ws - 1])
            block = wides[:, rank * n:(rank + 1) * n]
            for op, want in (("SUM", block.sum(0)), ("MAX", block.amax(0)), ("AVG", block.mean(0))):
                if f"scatter {n} {op}" in res:
                    assert torch.allclose(res[f"scatter {n} {op}"].double(), want, rtol=1e-6), (n, op, rank)
    for res in results:
        assert res["calls"] == (["symmetric.all_gather", "symmetric.broadcast", "symmetric.reduce_scatter"],
                               3 * 3 + 8 + 2)
        assert res["gather mismatch"] is not None and "symmetric" in res["gather mismatch"]
        assert torch.equal(res["in-place gather"], torch.cat([_values(r, 1000, torch.float32) for r in range(ws)]))
    for rank, res in enumerate(results):
        wides = torch.stack([_values(r, ws * 1000, torch.float32) for r in range(ws)])
        assert torch.allclose(res["in-place scatter"], wides[:, rank * 1000:(rank + 1) * 1000].sum(0)), rank


def test_symmetric_all_reduce_matches_reference_and_ranks_agree():
    ws = 3
    results = run_ranks(_symmetric, ws, timeout=120, backend=None)
    for key, got in results[0].items():
        if not isinstance(key, tuple):
            continue
        n, dtype, op = key
        stack = torch.stack([_values(r, n, getattr(torch, dtype.split(".")[1])).double() for r in range(ws)])
        want = {"SUM": stack.sum(0), "MAX": stack.amax(0), "MIN": stack.amin(0), "AVG": stack.mean(0)}[op]
        assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-5), key
        for other in results[1:]:
            assert torch.equal(other[key], got), f"{key}: ranks disagree bitwise"
    for res in results:
        assert res["segments left"] == [], res["segments left"]
        assert torch.equal(res["matrix"], torch.full((6, 7), 6.0))
        assert res["mismatch"] is not None and "symmetric@" in res["mismatch"], res["mismatch"]
        assert res["after"] == [3.0] * 5
    _check_gather_scatter_broadcast(results, ws)


def test_a_full_shared_memory_filesystem_is_a_clear_error_not_a_sigbus(monkeypatch):
    """Pages are reserved at allocation; a full /dev/shm (docker's default is 64 MB) raises there."""
    import errno
    import os

    from pt_dist._infra import symmetric_heap as symmetric_memory
    from pt_dist._infra.store import TCPStore

    heap = symmetric_memory.SymmetricHeap(TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10), 0, 1, 10.0, "g")
    assert heap.offset_of(heap.view(0, heap.allocate(100), 25, torch.float32)) == 0

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(symmetric_memory.os, "posix_fallocate", full)
    with pytest.raises(ValueError, match="no room for 8192 bytes.*shm-size"):
        heap.allocate(8192)
    assert heap._next == symmetric_memory.ALIGN  # the failed allocation took nothing


def test_an_exactly_full_heap_still_takes_empty_tensors_but_nothing_more(monkeypatch):
    """A zero-size tensor takes no page: it once took one past the rank's region, growing the segment file."""
    import os

    from pt_dist._infra import symmetric_heap as symmetric_memory
    from pt_dist._infra.store import TCPStore

    monkeypatch.setattr(symmetric_memory, "HEAP_BYTES", 2 * symmetric_memory.ALIGN)
    heap = symmetric_memory.SymmetricHeap(TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10), 0, 1, 10.0, "g")
    full = heap.view(0, heap.allocate(heap.per_rank), heap.per_rank // 4, torch.float32)
    assert heap.offset_of(full) == 0 and heap._next == heap.per_rank
    for _ in range(2):
        assert heap.allocate(0) == heap.per_rank and heap.view(0, heap.per_rank, 0, torch.float32).numel() == 0
    assert heap._next == heap.per_rank and os.fstat(heap._fd).st_size == heap.per_rank
    with pytest.raises(ValueError, match=f"1 bytes do not fit .* \\({heap.per_rank} of {heap.per_rank} bytes"):
        heap.allocate(1)
    heap.close()
