"""pt_dist.rpc next to torch.distributed.rpc (TensorPipe) in one run: empty rpc_sync latency, 1 MiB throughput.

Two spawned workers interleave the measurements rep by rep (ours first in even reps, torch's in odd ones), so
a change in machine load hits both alike. Our agent stays up for the run (its idle threads block); torch's is
started and shut down around its half of every rep (outside the timings), because TensorPipe's reactor threads
keep polling while it is up (a core at 100%) and, on a 2-core machine, would take CPU from whichever agent is
being measured. Latency: the mean round trip of ``--calls`` empty ``rpc_sync`` calls (a function taking and
returning nothing); throughput: ``--tensors`` ``rpc_async`` calls each carrying a 1 MiB float32 tensor to a
function that returns None, all in flight at once, MiB/s from first send to last answer. Both agents move
tensors between processes on one host with a single cross-memory copy where they can (TensorPipe's cma
channel; ours: _infra/rpc_cma.py). Each figure is the median over ``--reps``; the ratio is the median of the
per-rep ratios. The last line splits our latency by whether ours ran first in the rep or right after
TensorPipe (whose spinning leaves the vCPUs awake).

    uv run python packages/pt-dist/benchmarks/bench_rpc.py [--reps 15 --calls 200 --tensors 32]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import socket
import statistics
import time

import torch

log = logging.getLogger("bench_rpc")


def noop(*args):
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _latency(rpc, calls: int) -> float:
    rpc.rpc_sync("w1", noop)  # warm
    t0 = time.perf_counter()
    for _ in range(calls):
        rpc.rpc_sync("w1", noop)
    return (time.perf_counter() - t0) / calls * 1e6


def _throughput(rpc, tensors: int) -> float:
    t = torch.randn(1 << 18)  # 1 MiB
    rpc.rpc_sync("w1", noop, args=(t,))
    t0 = time.perf_counter()
    futs = [rpc.rpc_async("w1", noop, args=(t,)) for _ in range(tensors)]
    torch.futures.wait_all(futs)
    return tensors / (time.perf_counter() - t0)


def _torch_rep(theirs, store, rank: int, rep: int, args) -> dict:
    """Start TensorPipe on a fresh port, measure, shut it down."""
    if rank == 0:
        store.set(f"torch_port{rep}", str(_free_port()))
    port = int(bytes(store.get(f"torch_port{rep}")))
    theirs.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=theirs.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60))
    row = {}
    if rank == 0:
        row = {"lat_torch": _latency(theirs, args.calls), "thr_torch": _throughput(theirs, args.tensors)}
    theirs.shutdown()
    return row


def _worker(rank: int, port: int, args, out) -> None:
    torch.set_num_threads(1)
    import pt_dist.rpc as ours
    import torch.distributed.rpc as theirs
    from pt_dist._infra.store import TCPStore

    store = TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False, timeout=60)
    ours.init_rpc(f"w{rank}", rank=rank, world_size=2,
                  rpc_backend_options=ours.TensorPipeRpcBackendOptions(store=store, rpc_timeout=60))
    rows = []
    for rep in range(args.reps):
        row = {}
        for side in ("ours", "torch") if rep % 2 == 0 else ("torch", "ours"):  # each goes first every other rep
            if side == "torch":
                row.update(_torch_rep(theirs, store, rank, rep, args))
            else:
                if rank == 0:
                    row.update(lat_ours=_latency(ours, args.calls), thr_ours=_throughput(ours, args.tensors))
                ours.rpc_sync(f"w{1 - rank}", noop)  # both sides done with ours before TensorPipe starts
        rows.append(row)
    ours.shutdown()
    store.close()
    if rank == 0:
        out.put(rows)


def _table(rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    lat_ratio = statistics.median(r["lat_ours"] / r["lat_torch"] for r in rows)
    thr_ratio = statistics.median(r["thr_ours"] / r["thr_torch"] for r in rows)
    lines = ["| measure | pt_dist.rpc | torch.distributed.rpc (TensorPipe) | ours / torch | target |",
             "|---|---|---|---|---|",
             f"| empty rpc_sync round trip (us, median) | {med['lat_ours']:.0f} | {med['lat_torch']:.0f} | "
             f"{lat_ratio:.2f}x | <= 1.0x |",
             f"| rpc_async 1 MiB tensors (MiB/s, median) | {med['thr_ours']:.0f} | {med['thr_torch']:.0f} | "
             f"{thr_ratio:.2f}x | >= 1.0x |"]
    first = statistics.median(r["lat_ours"] for r in rows[::2])
    after = statistics.median(r["lat_ours"] for r in rows[1::2]) if len(rows) > 1 else float("nan")
    lines.append(f"\nour latency when ours ran first in the rep: {first:.0f} us; right after TensorPipe: "
                 f"{after:.0f} us")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--tensors", type=int, default=32)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, args, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    rows = out.get(timeout=600)
    for proc in procs:
        proc.join(60)
    log.info("%d reps on %d CPU(s), load average %.1f", len(rows), os.cpu_count(), os.getloadavg()[0])
    log.info("%s", _table(rows))


if __name__ == "__main__":
    main()
