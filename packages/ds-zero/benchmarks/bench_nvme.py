"""Benchmark: ZeRO-Infinity's swap throughput against the disk's own sequential bandwidth, in the same run.

The disk's bandwidth is measured with the plainest sequential transfer there is: one thread, ``O_DIRECT``,
8 MiB ``pwrite``/``pread`` calls over an aligned buffer. Then the same bytes go through ds_zero's
AsyncIOHandle (one large tensor) and through the optimizer swapper (sub-groups swapped out and in, as a
step does). Repeats are interleaved; medians in MiB/s and the ratio to the disk.

    uv run python packages/ds-zero/benchmarks/bench_nvme.py --path /tmp/ds_zero_bench    # ~1 minute
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import time

import torch

logger = logging.getLogger("bench_nvme")
MiB = 1 << 20


def _plain(buf: torch.Tensor, path: str, write: bool) -> float:
    """Sequential O_DIRECT transfer in 8 MiB calls from one thread; returns seconds."""
    from ds_zero.runtime.swap_tensor.aio import _buffer

    nbytes = buf.numel()
    view = memoryview(_buffer(buf, nbytes)).cast("B")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    t0 = time.perf_counter()
    for off in range(0, nbytes, 8 * MiB):
        piece = view[off : off + 8 * MiB]
        n = os.pwrite(fd, piece, off) if write else os.preadv(fd, [piece], off)
        assert n == len(piece)
    if write:
        os.fsync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    return seconds


def run(root: str, size_mib: int, repeats: int, threads: int, block: int, queue_depth: int) -> dict:
    from ds_zero.runtime.swap_tensor.aio import AsyncIOHandle, aligned_empty
    from ds_zero.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper
    from tqdm.auto import tqdm

    os.makedirs(root, exist_ok=True)
    nbytes = size_mib * MiB
    buf = aligned_empty(nbytes, torch.uint8)
    buf.random_(0, 255)
    aio = AsyncIOHandle(block, queue_depth, threads)
    sub = 16 * MiB // 4  # fp32 elements per sub-group: 3 segments of 16 MiB
    n_sub = max(1, nbytes // (3 * sub * 4))
    swapper = PartitionedOptimizerSwapper([sub] * n_sub, os.path.join(root, "swapper"), aio, 2, False)
    times = {k: [] for k in ("disk write", "disk read", "aio write", "aio read", "swap out", "swap in")}
    for _ in tqdm(range(repeats), desc="repeats"):
        times["disk write"].append(_plain(buf, os.path.join(root, "plain.bin"), True))
        t0 = time.perf_counter()
        aio.write(buf, os.path.join(root, "aio.bin")).wait()
        os.fsync(aio._fd(os.path.join(root, "aio.bin"), True))
        times["aio write"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for k in range(n_sub):  # as the step does: buffer k's states go out while the next are prepared
            i = swapper._free_buffer(set())
            swapper.owner[i] = k
            swapper.swap_out(k, i, async_op=True)
        swapper.drain()
        times["swap out"].append(time.perf_counter() - t0)
        times["disk read"].append(_plain(buf, os.path.join(root, "plain.bin"), False))
        t0 = time.perf_counter()
        aio.read(buf, os.path.join(root, "aio.bin")).wait()
        times["aio read"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        swapper.swap_in(0, async_op=True)
        for k in range(n_sub):  # read k+1 while k is "stepped"
            i = swapper.swap_in(k)
            if k + 1 < n_sub:
                swapper.swap_in(k + 1, async_op=True, avoid={i})
            swapper.owner[i] = None
        swapper.drain()
        times["swap in"].append(time.perf_counter() - t0)
    swapped = n_sub * 3 * sub * 4
    out = {k: (swapped if k.startswith("swap") else nbytes) / statistics.median(v) / MiB for k, v in times.items()}
    swapper.close()
    aio.close()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="/tmp/ds_zero_nvme_bench")
    parser.add_argument("--size-mib", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4, help="aio intra_op_parallelism")
    parser.add_argument("--block", type=int, default=1 << 20)
    parser.add_argument("--queue-depth", type=int, default=8)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        r = run(args.path, args.size_mib, args.repeats, args.threads, args.block, args.queue_depth)
    finally:
        shutil.rmtree(args.path, ignore_errors=True)
    logger.info(
        "%d MiB, O_DIRECT, aio: %d threads, %d KiB blocks, queue depth %d; median of %d interleaved repeats",
        args.size_mib,
        args.threads,
        args.block // 1024,
        args.queue_depth,
        args.repeats,
    )
    logger.info("| transfer | disk (1 thread, 8 MiB calls) MiB/s | ds_zero MiB/s | ds_zero / disk |")
    logger.info("|---|---|---|---|")
    for kind, disk in (("write", r["disk write"]), ("read", r["disk read"])):
        for name in (f"aio {kind}", "swap out" if kind == "write" else "swap in"):
            logger.info(f"| {name} | {disk:.0f} | {r[name]:.0f} | {r[name] / disk:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
