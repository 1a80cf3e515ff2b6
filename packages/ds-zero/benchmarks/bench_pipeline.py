"""Benchmark: a 1F1B pipeline training step, ds_zero's PipelineEngine vs torch.distributed.pipelining's Schedule1F1B.

Same model (an MLP of ``--layers`` Linear+GELU blocks cut evenly into ``--stages`` stages), same micro-batches
and SGD, gloo on CPU, one thread per rank. Steps alternate between the two (interleaved), the median step
time of each is reported with the ratio ds_zero / torch. Also writes the ideal and the measured 1F1B timelines
of a run with equal-cost stages as SVG pictures (``--svg-dir``).

    uv run python packages/ds-zero/benchmarks/bench_pipeline.py               # ~1-2 minutes
    uv run python packages/ds-zero/benchmarks/bench_pipeline.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import time

logger = logging.getLogger("bench_pipeline")


def _blocks(hidden: int, layers: int):
    import torch

    out = []
    for i in range(layers):
        torch.manual_seed(1000 + i)
        out += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return out


def bench_rank(rank, world, args):
    import ds_zero
    import torch
    import torch.distributed as dist
    from ds_zero.pipe import PipelineModule
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    hidden, layers, micro, mbs = args["hidden"], args["layers"], args["micro"], args["micro_batches"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(micro * mbs, hidden, generator=g)
    y = torch.randn(micro * mbs, hidden, generator=g)
    mse = torch.nn.MSELoss()

    # ds_zero: the blocks as a PipelineModule, uniform partition (equal layers per stage, like torch's split below).
    model = PipelineModule(_blocks(hidden, layers), num_stages=world, loss_fn=mse, partition_method="uniform")
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": mbs,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 0},
    }
    engine, *_ = ds_zero.initialize(model=model, config=cfg)
    batches = [(x[i * micro : (i + 1) * micro], y[i * micro : (i + 1) * micro]) for i in range(mbs)]

    # torch.distributed.pipelining: this rank's slice of the same blocks.
    blocks = _blocks(hidden, layers)
    per = len(blocks) // world
    sub = torch.nn.Sequential(*blocks[rank * per : (rank + 1) * per])
    stage = PipelineStage(sub, rank, world, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=mbs, loss_fn=mse)
    opt = torch.optim.SGD(sub.parameters(), lr=1e-3)

    def torch_step():
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()

    times = {"ds_zero": [], "torch": []}
    for i in range(args["warmup"] + args["steps"]):
        for name, fn in (("ds_zero", lambda: engine.train_batch(iter(batches))), ("torch", torch_step)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            if i >= args["warmup"]:
                times[name].append(time.perf_counter() - t0)
    engine.destroy()
    return {k: statistics.median(v) for k, v in times.items()}


def timeline_rank(rank, world, args):
    """Equal-cost stages (fixed sleeps), to picture the schedule against its ideal."""
    import ds_zero
    import torch
    from ds_zero.pipe import LayerSpec, PipelineModule

    spec = importlib.util.spec_from_file_location("ds_zero_test_pipe", os.path.join(args["tests"], "test_pipe.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = PipelineModule(
        [LayerSpec(mod.SleepLayer, args["seconds"]) for _ in range(world)],
        num_stages=world,
        loss_fn=lambda o, t: (o - t).pow(2).mean(),
    )
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": args["micro_batches"],
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    }
    engine, *_ = ds_zero.initialize(model=model, config=cfg)
    data = [(torch.randn(2, mod.DIM), torch.randn(2, mod.DIM)) for _ in range(args["micro_batches"])]
    engine.train_batch(iter(data))
    engine.train_batch(iter(data))
    timeline = engine.timeline
    engine.destroy()
    return timeline


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--svg-dir", default=None, help="write pipeline_1f1b_{ideal,measured}.svg here")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.hidden, args.steps = 128, 3
    root = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("bench_pipeline", os.path.join(root, "bench_pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_pipeline"] = mod
    spec.loader.exec_module(mod)
    from harness import run_ranks

    params = {
        "hidden": args.hidden,
        "layers": args.layers,
        "micro": args.micro,
        "micro_batches": args.micro_batches,
        "steps": args.steps,
        "warmup": 2,
    }
    res = run_ranks(mod.bench_rank, args.stages, params, timeout=1200, fresh=True)[0]
    logger.info(
        "1F1B step, %d stages (gloo, CPU, 1 thread/rank), MLP %dx%d, %d micro-batches of %d; median of %d "
        "interleaved steps",
        args.stages,
        args.layers,
        args.hidden,
        args.micro_batches,
        args.micro,
        args.steps,
    )
    logger.info("| torch Schedule1F1B (ms) | ds_zero PipelineEngine (ms) | ratio ds_zero/torch |")
    logger.info("|---|---|---|")
    logger.info(f"| {res['torch'] * 1e3:.1f} | {res['ds_zero'] * 1e3:.1f} | {res['ds_zero'] / res['torch']:.2f}x |")
    if args.svg_dir:
        from ds_zero.pipe import measured_timeline, render_svg, schedule_timeline

        stages, m = 4, 8
        tl = run_ranks(
            mod.timeline_rank,
            stages,
            {"micro_batches": m, "seconds": 0.05, "tests": os.path.join(root, "..", "tests")},
            timeout=300,
            fresh=True,
        )
        ideal, measured = schedule_timeline(stages, m), measured_timeline(tl)
        os.makedirs(args.svg_dir, exist_ok=True)
        for name, t, title in (
            ("ideal", ideal, f"1F1B, {stages} stages x {m} micro-batches: ideal (unit ticks)"),
            (
                "measured",
                measured,
                f"1F1B, {stages} stages x {m} micro-batches: measured (0.05 s passes, {measured['span']:.2f} s)",
            ),
        ):
            with open(os.path.join(args.svg_dir, f"pipeline_1f1b_{name}.svg"), "w") as f:
                f.write(render_svg(t, title=title))
        logger.info(
            "idle per stage: ideal %s, measured %s",
            [round(b, 3) for b in ideal["bubble"]],
            [round(b, 3) for b in measured["bubble"]],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
