"""All-reduce (or all-gather, reduce-scatter) time and bandwidth: pt_dist's tcp and shm vs torch's gloo, same run.

Each world size spawns its ranks once; every rank builds all the groups (torch gloo through
torch.distributed, our tcp and shm through pt_dist; shm also forced onto its two-copy staged path, and
shm again on a tensor from the group's symmetric heap), and for each message size the backends are timed
in turn, interleaved rep by rep, so machine load hits them alike. A rep is our shm barrier (ranks leave it
within microseconds), then ``iters`` back-to-back blocking calls on float32 timed on rank 0 (nccl-tests'
and OSU's convention: time per call = elapsed / iters); we report the median rep.
algbw = bytes / time (busbw would multiply by 2(N-1)/N).

    uv run python packages/pt-dist/benchmarks/bench_allreduce.py            # world 2 and 4, 1 KiB..64 MiB
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --worlds 2 --max-mib 4
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --op all_gather --max-mib 16   # FSDP's pair
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --op gather --backends gloo tcp shm
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --huge-pages   # tensors on 2 MiB pages
    uv run python packages/pt-dist/benchmarks/bench_allreduce.py --svg allreduce.svg   # and a chart
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import time

SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


BACKENDS = ["gloo", "tcp", "shm", "shm-staged", "shm-symm"]


def _reps(nbytes: int) -> tuple[int, int]:
    """(reps, iters per rep)"""
    return (15, 20) if nbytes <= 64 << 10 else (11, 8) if nbytes <= 1 << 20 else (7, 4) if nbytes <= 16 << 20 \
        else (5, 2)


ROOTED = ("gather", "scatter")  # (tensor, list on the root, root): no symmetric-heap form


def _buffers(op: str, nbytes: int, world: int, rank: int):
    """The call's tensors; size is the whole buffer (nccl-tests): the gathered output, the scattered input."""
    import torch

    whole, part = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // world)  # sums of zeros never overflow
    parts = list(whole.chunk(world)) if rank == 0 else None
    return {"all_reduce": (whole,), "all_gather": (whole, part), "reduce_scatter": (part, whole),
            "gather": (part, parts, 0), "scatter": (part, parts, 0)}[op]


def _progress(sizes: list[int], rank: int, desc: str):
    """Rank 0 shows a bar over the message sizes (tqdm, where installed: it is not a dependency of pt-dist)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return sizes
    return tqdm(sizes, desc=desc, unit="size", leave=False, disable=rank != 0)


def _rank(rank: int, world: int, port: int, sizes: list[int], backends: list[str], op: str, out) -> None:
    import torch
    import torch.distributed as dist
    from pt_dist._infra.store import PrefixStore, TCPStore
    from pt_dist.backends.shm import ProcessGroupSHM
    from pt_dist.backends.tcp import ProcessGroupTCP

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=300)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=300, secret=b"bench")
    tstore = dist.TCPStore("127.0.0.1", port + 1, world, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world, timeout=timeout)
    groups = {"tcp": ProcessGroupTCP(PrefixStore("tcp", store), rank, world, 300.0, "tcp", b"bench"),
              "shm": ProcessGroupSHM(PrefixStore("shm", store), rank, world, 300.0, "shm", b"bench"),
              "shm-staged": ProcessGroupSHM(PrefixStore("staged", store), rank, world, 300.0, "staged", b"bench",
                                            single_copy=False)}
    if rank == 0 and not groups["shm"]._use_cma:
        print("note: cross-memory attach is not permitted here; the shm column is the staged path too")
    # reps start from our shm barrier: ranks leave it within microseconds (spinning), where gloo's barrier
    # releases 4 ranks on 2 cores milliseconds apart, a skew that would be charged to every backend's first call
    sync = groups["shm"].barrier
    method = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
              "reduce_scatter": "reduce_scatter_tensor", "gather": "gather", "scatter": "scatter"}[op]
    run = {"gloo": getattr(dist, method)}
    run.update({name: getattr(g, method) for name, g in groups.items()})
    symm = {}  # shm-symm: the same call with its input from the group's symmetric heap
    run["shm-symm"] = lambda *_: getattr(groups["shm"], method)(*symm["t"])
    run = {name: fn for name, fn in run.items() if name in backends and not (op in ROOTED and name == "shm-symm")}
    rows = []
    for nbytes in _progress(sizes, rank, f"world {world} {op}"):
        t = _buffers(op, nbytes, world, rank)
        if "shm-symm" in run:  # the input (the last buffer) on the heap; outputs stay plain tensors
            symm["t"] = t[:-1] + (groups["shm"].symmetric_empty(t[-1].numel()).zero_(),)
        times = {name: [] for name in run}
        for fn in run.values():  # warm up (first-touch pages, socket buffers)
            fn(*t)
        reps, iters = _reps(nbytes)
        for _ in range(reps):
            for name, fn in run.items():
                sync()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn(*t)
                times[name].append((time.perf_counter() - t0) / iters)
        rows.append((nbytes, {k: statistics.median(v) if v else float("nan") for k, v in times.items()}))
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
    ap.add_argument("--op", default="all_reduce",
                    choices=["all_reduce", "all_gather", "reduce_scatter", "gather", "scatter"],
                    help="collective to time (default all_reduce); size is the whole (gathered/scattered) buffer")
    ap.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS,
                    help="which columns to time (default all; the others print nan)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="ranks allocate tensors >= 2 MiB on transparent huge pages (torch's THP_MEM_ALLOC_ENABLE=1; "
                         "all backends alike)")
    ap.add_argument("--svg", metavar="PATH", help="also draw bandwidth against size to this SVG file")
    args = ap.parse_args()
    if args.huge_pages:  # read by torch's CPU allocator when the spawned ranks start
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    sizes = [s for s in SIZES if s <= args.max_mib * (1 << 20)]
    ctx = mp.get_context("spawn")
    cols = [b for b in BACKENDS if not (args.op in ROOTED and b == "shm-symm")]
    ours = cols[1:]
    head = ["world", "size"] + [f"{b} us" for b in cols] + [f"{b} GB/s" for b in cols] + \
        [f"{b} / gloo" for b in ours]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    panels = {}
    for world in args.worlds:
        port = 20000 + os.getpid() % 10000
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, world, port, sizes, args.backends, args.op, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = panels[world] = q.get(timeout=1800)
        for p in procs:
            p.join(60)
        for nbytes, med in rows:
            med = {b: med.get(b, float("nan")) for b in cols}
            cells = [str(world), _fmt_size(nbytes)] + [f"{med[b] * 1e6:.0f}" for b in cols] + \
                [f"{nbytes / med[b] / 1e9:.2f}" for b in cols] + [f"{med['gloo'] / med[b]:.2f}x" for b in ours]
            print("| " + " | ".join(cells) + " |", flush=True)
    if args.svg:
        from bandwidth_chart import write_svg  # beside this script

        write_svg(args.svg, args.op, panels, [b for b in cols if b in args.backends])
        print(f"chart: {args.svg}")


if __name__ == "__main__":
    main()
