"""Benchmark: ds_zero vs DeepSpeed 0.19.8, ZeRO stages 1-3, world size 2 on CPU (gloo), same config and data.

Two configs per stage: ``tuned`` (``overlap_comm``, 2M-element buckets) and ``defaults`` (DeepSpeed's own
``zero_optimization`` defaults: only ``stage`` set, 5e8-element buckets, no ``overlap_comm`` at stages 1-2).
Prints, per config and stage, the median step time of each (and the ratio ours/DeepSpeed) and ds_zero's
per-rank memory (summed tensor bytes) next to the ZeRO formula. Run from the repo root:

    uv run python packages/ds-zero/benchmarks/bench_zero.py            # ~2-4 minutes
    uv run python packages/ds-zero/benchmarks/bench_zero.py --dtype fp32 --layers 8 --configs defaults
    uv run python packages/ds-zero/benchmarks/bench_zero.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import logging
import os
import pstats
import statistics
import sys
import time

logger = logging.getLogger("bench_zero")


CONFIGS = ("tuned", "defaults")


def _config(stage: int, micro: int, dtype: str = "bf16", clip: float = 1.0, kind: str = "tuned") -> dict:
    zero = {"stage": stage}  # "defaults": every other zero_optimization key at DeepSpeed's default
    if kind == "tuned":
        zero.update({
            "overlap_comm": True,
            "reduce_bucket_size": 2_000_000,
            "allgather_bucket_size": 2_000_000,
            "stage3_prefetch_bucket_size": 2_000_000,
            "stage3_param_persistence_threshold": 10_000,
        })
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "bf16": {"enabled": dtype == "bf16"},
        "gradient_clipping": clip,  # 0 turns clipping off
        "zero_optimization": zero,
    }


def _model(hidden: int, layers: int):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 16))


def bench_rank(rank, world, args):
    import deepspeed
    import deepspeed.ops
    import ds_zero
    import torch
    import torch.distributed as dist
    from ds_zero.memory import zero_memory_formula

    # Plain torch.distributed all-reduce for DeepSpeed too (no JIT-built shared-memory op): same comm engine.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    torch.set_num_threads(1)
    hidden, layers, micro, steps, warmup = args["hidden"], args["layers"], args["micro"], args["steps"], 2
    g = torch.Generator().manual_seed(rank)
    dtype = torch.bfloat16 if args["dtype"] == "bf16" else torch.float32
    x = torch.randn(micro, hidden, generator=g).to(dtype)
    y = torch.randn(micro, 16, generator=g).to(dtype)
    rows = []
    for kind, stage in [(k, s) for k in args["configs"] for s in (1, 2, 3)]:
        row = {"config": kind, "stage": stage}
        engines = {}
        for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
            model = _model(hidden, layers)
            row["numel"] = sum(p.numel() for p in model.parameters())
            cfg = _config(stage, micro, args["dtype"], args["clip"], kind)
            engines[impl], *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
        times = {impl: [] for impl in engines}
        profiles = {impl: cProfile.Profile() for impl in engines} if args["profile"] else {}
        for i in range(warmup + steps):  # interleaved, so both see the same machine load
            for impl, engine in engines.items():
                dist.barrier()
                prof = profiles.get(impl) if i >= warmup else None
                if prof is not None:
                    prof.enable()
                t0 = time.perf_counter()
                loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
                engine.backward(loss)
                engine.step()
                if i >= warmup:
                    times[impl].append(time.perf_counter() - t0)
                if prof is not None:
                    prof.disable()
        row.update({impl: statistics.median(t) for impl, t in times.items()})
        for impl, prof in profiles.items():
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args["profile"])
            row[f"profile_{impl}"] = out.getvalue()
        row["memory"] = engines["ds_zero"].memory_breakdown()["total"]
        # fp32: 4-byte params and grads (the fp32 master copy and Adam's moments are K = 12 either way)
        b = 2 if args["dtype"] == "bf16" else 4
        row["formula"] = zero_memory_formula(row["numel"], world, stage, param_bytes=b)["total"]
        engines["ds_zero"].destroy()
        del engines
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient_clipping (0: off)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from " + ", ".join(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="tiny model, 3 steps")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="cProfile each engine's timed steps; print rank 0's top N functions by own time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    configs = [c for c in args.configs.split(",") if c]
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs must name some of {', '.join(CONFIGS)}, got {args.configs!r}")
    if args.quick:
        args.hidden, args.layers, args.steps = 128, 2, 3
    root = os.path.dirname(os.path.abspath(__file__))
    # Ranks import this file by path; load it under a real module name (spawned ranks have their own __main__).
    spec = importlib.util.spec_from_file_location("bench_zero", os.path.join(root, "bench_zero.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_zero"] = mod
    spec.loader.exec_module(mod)
    from harness import run_ranks

    params = {
        "hidden": args.hidden,
        "layers": args.layers,
        "micro": args.micro,
        "steps": args.steps,
        "dtype": args.dtype,
        "clip": args.clip,
        "configs": configs,
        "profile": args.profile,
    }
    results = run_ranks(mod.bench_rank, 2, params, timeout=900, fresh=True)
    rows = results[0]
    numel = rows[0]["numel"]
    logger.info(
        f"ZeRO world_size=2, CPU/gloo, {args.dtype}, Adam, gradient_clipping={args.clip:g}; "
        f"MLP {args.layers}x{args.hidden} "
        f"({numel / 1e6:.2f} M params), micro batch {args.micro}; median of {args.steps} interleaved steps (rank 0)"
    )
    logger.info(
        "| config | stage | DeepSpeed step (ms) | ds_zero step (ms) | ratio ds_zero/DS | ds_zero memory/rank (MB) "
        "| ZeRO formula (MB) | measured/formula |"
    )
    logger.info("|---|---|---|---|---|---|---|---|")
    for r in rows:
        logger.info(
            f"| {r['config']} | {r['stage']} | {r['deepspeed'] * 1e3:.1f} | {r['ds_zero'] * 1e3:.1f} | "
            f"{r['ds_zero'] / r['deepspeed']:.2f}x | {r['memory'] / 1e6:.2f} | {r['formula'] / 1e6:.2f} | "
            f"{r['memory'] / r['formula']:.3f} |"
        )
    for r in rows:
        for impl in ("deepspeed", "ds_zero"):
            if f"profile_{impl}" in r:
                logger.info(f"--- {impl}, {r['config']}, stage {r['stage']}, {args.steps} steps (rank 0) ---")
                logger.info(r[f"profile_{impl}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
