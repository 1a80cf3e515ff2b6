"""What the side-by-side benchmarks share: spawning the ranks, the interleaved timing loop, per-rep ratios.

The variants take turns rep by rep (a rep: a barrier, then ``steps`` timed calls of one variant), so the shared
machine's load drifts over all of them alike; a ratio is the median over reps of two variants' times within one
rep, which is steadier than the ratio of two medians.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time


def spawn_ranks(target, world: int, *args, timeout: float = 1800):
    """Start ``target(rank, world, port, *args, queue)`` in ``world`` spawned processes; return what rank 0 puts."""
    port = 20000 + os.getpid() % 10000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return q.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(60)


def interleaved(step, names, reps: int, steps: int, sync) -> dict[str, list[float]]:
    """Seconds per ``step(name)``: for each rep, each name in turn, ``sync()`` then ``steps`` timed calls."""
    times = {name: [] for name in names}
    for _ in range(reps):
        for name in names:
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(name)
            times[name].append((time.perf_counter() - t0) / steps)
    return times


def per_rep_ratios(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """The median of the per-rep ratios a / b and the middle half's bounds (first and third quartile)."""
    per_rep = sorted(x / y for x, y in zip(a, b))
    return statistics.median(per_rep), per_rep[len(per_rep) // 4], per_rep[(3 * len(per_rep)) // 4]
