"""All-reduce latency and algorithm bandwidth: pt_dist's tcp and shm backends vs torch's gloo, same run.

Each world size spawns its ranks once; every rank builds all three groups (torch gloo through
torch.distributed, our tcp and shm through pt_dist), and for each message size the three backends are
timed back to back (interleaved, so machine load hits them alike). A rep is one blocking all_reduce of
float32 on rank 0 after a gloo barrier; we report medians. algbw = bytes / time (nccl-tests' convention;
busbw would multiply by 2(N-1)/N).

    uv run python packages/pt-dist/benchmarks/bench_allreduce.py            # world 2 and 4, 1 KiB..64 MiB
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --worlds 2 --max-mib 4
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import time

SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _reps(nbytes: int) -> int:
    return 40 if nbytes <= 64 << 10 else 15 if nbytes <= 1 << 20 else 7 if nbytes <= 4 << 20 else 4


def _rank(rank: int, world: int, port: int, sizes: list[int], out) -> None:
    import torch
    import torch.distributed as dist
    from pt_dist.backends.shm import ProcessGroupSHM
    from pt_dist.backends.tcp import ProcessGroupTCP
    from pt_dist.store import PrefixStore, TCPStore

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=300)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=300, secret=b"bench")
    tstore = dist.TCPStore("127.0.0.1", port + 1, world, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world, timeout=timeout)
    groups = {"tcp": ProcessGroupTCP(PrefixStore("tcp", store), rank, world, 300.0, "tcp", b"bench"),
              "shm": ProcessGroupSHM(PrefixStore("shm", store), rank, world, 300.0, "shm", b"bench")}
    run = {"gloo": lambda t: dist.all_reduce(t),
           "tcp": lambda t: groups["tcp"].all_reduce(t),
           "shm": lambda t: groups["shm"].all_reduce(t)}
    rows = []
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4)  # repeated sums of zeros never overflow
        times = {name: [] for name in run}
        for fn in run.values():  # warm up (first-touch pages, socket buffers)
            fn(t)
        for _ in range(_reps(nbytes)):
            for name, fn in run.items():
                dist.barrier()
                t0 = time.perf_counter()
                fn(t)
                times[name].append(time.perf_counter() - t0)
        rows.append((nbytes, {k: statistics.median(v) for k, v in times.items()}))
    check = torch.full((1000,), float(rank))
    for g in groups.values():
        c = check.clone()
        g.all_reduce(c)
        assert torch.all(c == sum(range(world))), "backend produced a wrong sum"
    dist.barrier()
    for g in groups.values():
        g.shutdown()
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def _fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-mib", type=float, default=64, help="largest message in MiB (default 64)")
    args = ap.parse_args()
    sizes = [s for s in SIZES if s <= args.max_mib * (1 << 20)]
    ctx = mp.get_context("spawn")
    print("| world | size | gloo lat (us) | tcp lat (us) | shm lat (us) | gloo algbw (GB/s) | tcp algbw | shm algbw "
          "| tcp / gloo | shm / gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for world in args.worlds:
        port = 20000 + os.getpid() % 10000
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, world, port, sizes, q)) for r in range(world)]
        for p in procs:
            p.start()
        rows = q.get(timeout=1800)
        for p in procs:
            p.join(60)
        for nbytes, med in rows:
            bw = {k: nbytes / v / 1e9 for k, v in med.items()}
            print(f"| {world} | {_fmt_size(nbytes)} | {med['gloo'] * 1e6:.0f} | {med['tcp'] * 1e6:.0f} | "
                  f"{med['shm'] * 1e6:.0f} | {bw['gloo']:.2f} | {bw['tcp']:.2f} | {bw['shm']:.2f} | "
                  f"{med['gloo'] / med['tcp']:.2f}x | {med['gloo'] / med['shm']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
