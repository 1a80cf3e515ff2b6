"""Random collectives against the local float64 reference, under random chunk, slot and path thresholds.

The matrix in ``test_collectives.py`` is exhaustive over a few sizes; this draws sizes, dtypes, ops, roots,
the in-place forms and the shm backend's thresholds at random (fixed seeds, so a failure replays), which is
how boundary bugs in chunked and multi-round loops show up (gather and scatter among them). ``symmetric``
puts every shm input on the group's symmetric heap.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402
from ptdist_testutil import close, reference  # noqa: E402

SIZES = [0, 1, 2, 3, 5, 17, 255, 256, 1000, 4097, 20000]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16]
KINDS = ["all_reduce", "reduce_scatter", "reduce_scatter in place", "all_gather", "all_gather in place", "broadcast",
         "gather", "scatter"]


def _one(rng, rank, world, xs, op, place):
    """Run one random collective; return (got, want)."""
    n, dtype = xs[0].numel(), xs[0].dtype
    kind = rng.choice(KINDS)
    if kind == "all_reduce":
        t = place(xs[rank])
        pt_dist.all_reduce(t, op=op)
        return t, reference(xs, op)
    if kind.startswith("reduce_scatter"):
        m = n // world
        wide = place(xs[rank][:m * world])
        want = reference([x[:m * world] for x in xs], op)[rank * m:(rank + 1) * m]
        out = wide[rank * m:(rank + 1) * m] if kind.endswith("in place") else torch.empty(m, dtype=dtype)
        pt_dist.reduce_scatter_tensor(out, wide, op=op)
        return out, want
    if kind.startswith("all_gather"):
        want = torch.cat(xs)
        if kind.endswith("in place"):
            out = place(torch.zeros(world * n, dtype=dtype))
            out[rank * n:(rank + 1) * n] = xs[rank]
            pt_dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        else:
            out = torch.empty(world * n, dtype=dtype)
            pt_dist.all_gather_into_tensor(out, place(xs[rank]))
        return out, want
    root = rng.randrange(world)
    if kind == "gather":
        outs = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == root else None
        pt_dist.gather(place(xs[rank]), outs, dst=root)
        return (torch.cat(outs), torch.cat(xs)) if rank == root else (xs[rank], xs[rank])
    if kind == "scatter":
        out = place(torch.zeros(n, dtype=dtype))
        pt_dist.scatter(out, [x.clone() for x in xs] if rank == root else None, src=root)
        return out, xs[rank]
    t = place(xs[rank])
    pt_dist.broadcast(t, src=root)
    return t, xs[root]


def _random_run(rank, world, seed, backend, symmetric):
    from pt_dist._infra import cma, single_copy
    from pt_dist.backends import tcp
    from pt_dist.backends.shm import process_group_shm as shm

    rng = random.Random(seed)
    saved = tcp.CHUNK_BYTES, shm.SLOT_BYTES, shm.SMALL_BYTES, cma.MIN_BYTES, single_copy.CHUNK_BYTES
    tcp.CHUNK_BYTES = rng.choice([64, 512, 4096, 1 << 20])
    shm.SLOT_BYTES = rng.choice([1024, 4096, 1 << 16])
    shm.SMALL_BYTES = rng.choice([256, 1024, 2 << 20])
    cma.MIN_BYTES = rng.choice([0, 1024, 1 << 18])
    single_copy.CHUNK_BYTES = rng.choice([64, 512, 1 << 18])
    fails = []
    try:
        util.join(rank, world, backend, key=f"random-{backend}-{seed}-{symmetric}")

        def place(t):
            if not symmetric or t.numel() == 0:
                return t.clone()
            s = pt_dist.symmetric_empty(t.numel(), dtype=t.dtype)
            return s.copy_(t)

        for case in range(30):
            n, dtype = rng.choice(SIZES), rng.choice(DTYPES)
            op = rng.choice([ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT]
                            + ([ReduceOp.AVG] if dtype.is_floating_point else
                               [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]))
            g = torch.Generator().manual_seed(seed * 1000 + case)
            xs = [torch.randint(-3, 4, (n,), generator=g).to(dtype) for _ in range(world)]
            got, want = _one(rng, rank, world, xs, op, place)
            if not close(got, want):
                fails.append(f"seed {seed} case {case}: n={n} {dtype} {op.name} rank {rank}: got "
                             f"{got.flatten()[:5].tolist()} want {want.flatten()[:5].tolist()}")
        util.leave()
    finally:
        tcp.CHUNK_BYTES, shm.SLOT_BYTES, shm.SMALL_BYTES, cma.MIN_BYTES, single_copy.CHUNK_BYTES = saved
        if pt_dist.is_initialized():
            pt_dist.destroy_process_group()
    return fails


@pytest.mark.parametrize("backend,symmetric", [("tcp", False), ("shm", False), ("shm", True)])
def test_random_collectives_match_reference(backend, symmetric):
    for seed in range(3):  # world sizes 2, 3, 4
        results = run_ranks(_random_run, 2 + seed, seed, backend, symmetric, backend=None, timeout=120)
        assert [f for r in results for f in r] == []
