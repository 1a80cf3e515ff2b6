"""Benchmark: one Adam(W) step on fp32 CPU tensors (10M-100M parameters).

ds_zero's DeepSpeedCPUAdam (C++ kernel, and its pure-torch fallback) against torch.optim.AdamW (foreach and
fused) and DeepSpeed's DeepSpeedCPUAdam when it builds here. Every implementation owns its own parameters and
states; the repeats are interleaved (one step of each in turn) and the median is reported, with ratios.

    uv run python packages/ds-zero/benchmarks/bench_cpu_adam.py            # ~2-4 minutes
    uv run python packages/ds-zero/benchmarks/bench_cpu_adam.py --quick
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

logger = logging.getLogger("bench_cpu_adam")


def _impls(include_ds: bool):
    from ds_zero.ops import DeepSpeedCPUAdam

    impls = {
        "ds_zero CPUAdam": lambda p: DeepSpeedCPUAdam(p, lr=1e-3, weight_decay=0.01, use_kernel=True),
        "ds_zero (torch path)": lambda p: DeepSpeedCPUAdam(p, lr=1e-3, weight_decay=0.01, use_kernel=False),
        "torch AdamW foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=True),
        "torch AdamW fused": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True),
    }
    if include_ds:
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam as DsCPUAdam

            probe = torch.nn.Parameter(torch.zeros(8))
            probe.grad = torch.zeros(8)
            DsCPUAdam([probe]).step()
            impls["DeepSpeed CPUAdam"] = lambda p: DsCPUAdam(p, lr=1e-3, weight_decay=0.01, adamw_mode=True)
        except Exception as e:  # the JIT build needs a compiler and DeepSpeed's headers
            logger.warning("DeepSpeed's CPUAdam did not build here: %s", e)
    return impls


def run(sizes, repeats: int, include_ds: bool) -> list[dict]:
    from tqdm.auto import tqdm

    rows = []
    impls = _impls(include_ds)
    for numel in sizes:
        opts = {}
        for name, make in impls.items():
            p = torch.nn.Parameter(torch.randn(numel))
            p.grad = torch.randn(numel)
            opts[name] = make([p])
            for _ in range(2):  # allocate the states and wake the thread pool outside the timing
                opts[name].step()
        times = {name: [] for name in impls}
        for _ in tqdm(range(repeats), desc=f"{numel / 1e6:.0f}M params", leave=False):
            for name, opt in opts.items():
                t0 = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - t0)
        row = {"numel": numel, **{n: statistics.median(t) for n, t in times.items()}}
        rows.append(row)
        del opts
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10e6, 30e6, 100e6])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-deepspeed", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.sizes, args.repeats = [2e6], 3
    torch.set_num_threads(args.threads)
    rows = run([int(s) for s in args.sizes], args.repeats, not args.no_deepspeed)
    names = [k for k in rows[0] if k != "numel"]
    logger.info(
        "CPUAdam step, fp32, %d threads; median of %d interleaved repeats (ms); ratio = time / ds_zero's",
        args.threads,
        args.repeats,
    )
    logger.info("| params | " + " | ".join(names) + " |")
    logger.info("|---" * (len(names) + 1) + "|")
    for r in rows:
        ours = r["ds_zero CPUAdam"]
        cells = [f"{r[n] * 1e3:.1f} ({r[n] / ours:.2f}x)" for n in names]
        logger.info(f"| {r['numel'] / 1e6:.0f}M | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
