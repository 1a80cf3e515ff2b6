"""Save and load time of ``pt_dist.checkpoint`` against torch's ``torch.distributed.checkpoint``, same ranks.

World size 2, one run: both ranks hold the same sharded state dict (``--tensors`` float32 tensors of
``--rows`` x ``--cols``, each a DTensor ``Shard(0)`` over the 2 ranks: pt_dist's DTensor on pt_dist's world,
torch's on torch's gloo group), and the two implementations take turns rep by rep: a barrier, ``save`` into a
fresh directory (both fsync their files), a barrier, ``load`` into zeroed DTensors of the other sharding
(``Shard(1)``: every rank reads from both ranks' files). Reported: the median rep, rank 0's clock, and each ratio
as the median over reps of pt_dist's time over torch's in that rep. pt_dist also computes a CRC-32 of every file
on save and checks it on load; torch does neither.

    uv run python packages/pt-dist/benchmarks/bench_checkpoint.py
    uv run python packages/pt-dist/benchmarks/bench_checkpoint.py --reps 5 --tensors 4
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import tempfile
import time

from _ranks import spawn_ranks


def _rank(rank, world, port, args, root, out) -> None:
    import pt_dist
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as torch_dcp
    from pt_dist import checkpoint as dcp
    from pt_dist._infra.store import TCPStore
    from pt_dist.device_mesh import init_device_mesh
    from pt_dist.tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor as tdistribute

    torch.set_num_threads(1)
    tstore = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=600))
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world)
    store = TCPStore("127.0.0.1", port + 1, world, is_master=rank == 0, timeout=600, secret=b"bench")
    pt_dist.init_process_group("tcp", store=store, rank=rank, world_size=world, timeout=600)
    mesh, tmesh = init_device_mesh("cpu", (world,)), torch_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    full = {f"layer{i}.weight": torch.randn(args.rows, args.cols, generator=g) for i in range(args.tensors)}
    impls = {
        "pt_dist": (dcp, lambda t, p: distribute_tensor(t, mesh, [Shard(p)])),
        "torch": (torch_dcp, lambda t, p: tdistribute(t, tmesh, [TShard(p)])),
    }
    states = {name: {k: shard(v, 0) for k, v in full.items()} for name, (_, shard) in impls.items()}
    targets = {name: {k: shard(torch.zeros_like(v), 1) for k, v in full.items()} for name, (_, shard) in
               impls.items()}
    times = {f"{name} {op}": [] for name in impls for op in ("save", "load")}
    for rep in range(args.reps + 1):  # rep 0 warms up (first-touch pages, lazy imports)
        for name, (module, _) in impls.items():
            where = os.path.join(root, f"{name}-{rep}")
            dist.barrier()
            t0 = time.perf_counter()
            module.save(states[name], checkpoint_id=where)
            t1 = time.perf_counter()
            dist.barrier()
            t2 = time.perf_counter()
            module.load(targets[name], checkpoint_id=where)
            t3 = time.perf_counter()
            if rep:
                times[f"{name} save"].append(t1 - t0)
                times[f"{name} load"].append(t3 - t2)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(where)
    ok = all(torch.equal(targets[n][k].full_tensor(), v) for n in impls for k, v in full.items())
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    dist.destroy_process_group()
    if rank == 0:
        out.put((times, ok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=512)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    world = 2
    root = tempfile.mkdtemp(prefix="bench_checkpoint_")
    try:
        times, ok = spawn_ranks(_rank, world, args, root, timeout=3600)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = args.tensors * args.rows * args.cols * 4 / 2**20
    print(f"state dict: {args.tensors} float32 tensors of {args.rows}x{args.cols} ({mib:.0f} MiB, {mib / world:.0f} "
          f"MiB per rank), Shard(0) saved, loaded as Shard(1); world {world}; medians of {args.reps} interleaved "
          f"reps; loaded values equal: {ok}\n")
    print("| step | pt_dist ms | torch ms | pt_dist / torch (median of per-rep ratios) |")
    print("|---|---|---|---|")
    for op in ("save", "load"):
        ours, theirs = times[f"pt_dist {op}"], times[f"torch {op}"]
        ratio = statistics.median(a / b for a, b in zip(ours, theirs))
        print(f"| {op} | {statistics.median(ours) * 1e3:.1f} | {statistics.median(theirs) * 1e3:.1f} | "
              f"{ratio:.2f}x |")


if __name__ == "__main__":
    main()
