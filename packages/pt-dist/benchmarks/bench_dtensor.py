"""DTensor op times of ``pt_dist.tensor`` against torch's DTensor, same ranks.

World size 2, one run: pt_dist's world is the gloo adapter, so torch's default group is the same gloo world.
Cases (each on a [n, n] float32 tensor, ``--sizes``):

* ``redistribute S(0)->R``: ``distribute_tensor(x, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])``'s
  redistribute alone: one all-gather (the collective) plus the placement machinery around it;
* ``mm S(0)@R``: a DTensor ``mm`` that needs no communication (rows of A times a replicated B): what the dispatch
  path (rule, meta shapes, wrapping) costs next to the local ``mm``.

Variants: ``torch gloo`` (torch's DTensor on its gloo group), ``pt gloo`` (ours through pt_dist's adapter onto the
same gloo transport: the ratio is DTensor's own machinery), ``pt shm`` / ``pt tcp`` (ours on pt_dist's backends).
The variants take turns rep by rep (a shm barrier, then ``--iters`` timed calls); reported: the median rep per
call and each ratio as the median of the per-rep ratios.

    uv run python packages/pt-dist/benchmarks/bench_dtensor.py
    uv run python packages/pt-dist/benchmarks/bench_dtensor.py --sizes 64 1024 --reps 9 --iters 20
"""

from __future__ import annotations

import argparse
import statistics

from _ranks import interleaved, spawn_ranks

VARIANTS = ["torch gloo", "pt gloo", "pt shm", "pt tcp"]
CASES = ["redistribute S(0)->R", "mm S(0)@R"]


def _meshes(world):
    import pt_dist
    import torch.distributed.tensor as tt
    from pt_dist.device_mesh import DeviceMesh, init_device_mesh
    from pt_dist.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    ours = (Shard, Replicate, distribute_tensor)
    return {"torch gloo": (torch_mesh("cpu", (world,)), (tt.Shard, tt.Replicate, tt.distribute_tensor)),
            "pt gloo": (init_device_mesh("cpu", (world,)), ours),
            "pt shm": (DeviceMesh.from_group(pt_dist.new_group(backend="shm"), "cpu"), ours),
            "pt tcp": (DeviceMesh.from_group(pt_dist.new_group(backend="tcp"), "cpu"), ours)}


def _calls(mesh, api, n):
    """case -> a no-argument function doing one timed call, and a check value (the result's whole sum)."""
    import torch

    shard, replicate, distribute = api
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    w = torch.randn(n, n, generator=torch.Generator().manual_seed(1))
    xs, wr = distribute(x, mesh, [shard(0)]), distribute(w, mesh, [replicate()])
    return {"redistribute S(0)->R": (lambda: xs.redistribute(mesh, [replicate()]),
                                     lambda: xs.redistribute(mesh, [replicate()]).to_local().sum().item()),
            "mm S(0)@R": (lambda: torch.mm(xs, wr), lambda: torch.mm(xs, wr).full_tensor().sum().item())}


def _rank(rank, world, port, args, out) -> None:
    import pt_dist
    import torch
    from pt_dist._infra.store import TCPStore

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=600, secret=b"bench")
    pt_dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=600)
    meshes = _meshes(world)
    sync = pt_dist.new_group(backend="shm").barrier
    times, checks = {}, {}
    with torch.no_grad():
        for n in args.sizes:
            calls = {v: _calls(mesh, api, n) for v, (mesh, api) in meshes.items()}
            for v in VARIANTS:
                for case in CASES:
                    checks[(n, case, v)] = round(calls[v][case][1](), 3)
                    calls[v][case][0]()  # warm up
            keys = [(case, v) for case in CASES for v in VARIANTS]
            got = interleaved(lambda key, c=calls: c[key[1]][key[0]][0](), keys, args.reps, args.iters, sync)
            times.update({(n, case, v): t for (case, v), t in got.items()})
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    if rank == 0:
        out.put((times, checks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20, help="timed calls per rep")
    args = ap.parse_args()
    world = 2
    times, checks = spawn_ranks(_rank, world, args)
    same = all(checks[(n, c, v)] == checks[(n, c, VARIANTS[0])] for n, c, v in checks)
    print(f"world {world}, float32 [n, n]; medians of {args.reps} interleaved reps of {args.iters} calls; every "
          f"variant's results equal torch's: {same}\n")
    print("| n | case | " + " | ".join(f"{v} us" for v in VARIANTS) + " | " +
          " | ".join(f"{v} / torch gloo" for v in VARIANTS[1:]) + " |")
    print("|---" * (2 + 2 * len(VARIANTS) - 1) + "|")
    for n in args.sizes:
        for case in CASES:
            t = {v: times[(n, case, v)] for v in VARIANTS}
            meds = " | ".join(f"{statistics.median(t[v]) * 1e6:.0f}" for v in VARIANTS)
            ratios = " | ".join(f"{statistics.median(a / b for a, b in zip(t[v], t[VARIANTS[0]])):.2f}x"
                                for v in VARIANTS[1:])
            print(f"| {n} | {case} | {meds} | {ratios} |")


if __name__ == "__main__":
    main()
