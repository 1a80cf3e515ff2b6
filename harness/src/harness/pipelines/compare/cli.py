"""``uv run miniframes-compare``: every training strategy on the same model and data, then the inference engines,
written to a report directory (report.md, results.json, charts) with a terminal summary.

    uv run miniframes-compare                          # 2 ranks on CPU, every strategy, the inference table
    uv run miniframes-compare --strategies pt-dist-ddp,zero-3,tp --skip-inference
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path

from harness.pipelines.compare import formulas, report
from harness.pipelines.compare.measure import STRATEGIES, run_strategy
from harness.pipelines.compare.strategies import CompareSpec

SCALE_ASSUMPTIONS = ("parameters, gradients and optimizer states only (no activations, buffers or fragmentation); "
                     "bytes per parameter as measured here in fp32 (4 + 4 + 8 for torch's AdamW, 4 + 4 + 12 for "
                     "ds-zero, which keeps an fp32 master copy as DeepSpeed does; the ZeRO paper's mixed-precision "
                     "2 + 2 + 12 is the same 16 bytes for DDP); a sharded kind split over every device, TP over at "
                     "most 8 (one node)")
PEERS = ("torch-ddp", "torch-fsdp2", "deepspeed-zero-2", "deepspeed-zero-3")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="miniframes-compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("compare-report"), help="report directory")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, from: " + ", ".join(STRATEGIES))
    p.add_argument("--nproc", type=int, default=2, help="ranks (world size) for every training strategy")
    p.add_argument("--steps", type=int, default=3, help="measured steps per strategy (after --warmup)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (bucket rebuild, first gathers)")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=4, help="sequences per data-parallel rank per step")
    p.add_argument("--zero-collectives", choices=["owner", "allreduce"], default="owner",
                   help="ds-zero: reduce gradients to their owners (the paper) or all-reduce them (its gloo default)")
    p.add_argument("--devices", default="8,64,1024", help="device counts for the scale column")
    p.add_argument("--budget-gb", type=float, default=80.0, help="memory per device for the scale column")
    p.add_argument("--skip-inference", action="store_true")
    p.add_argument("--requests", type=int, default=32, help="inference: requests in the workload")
    p.add_argument("--max-tokens", type=int, default=32, help="inference: new tokens per request")
    p.add_argument("--batch-size", type=int, default=8, help="inference: static batch size")
    p.add_argument("--kv-budget", type=int, default=2048, help="inference: KV token slots for the concurrency row")
    p.add_argument("--repeats", type=int, default=3, help="inference: interleaved runs per engine (median kept)")
    return p


def _fail(message: str):
    print(f"miniframes-compare: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args) -> tuple[list[str], list[int]]:
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        _fail(f"--strategies: unknown {unknown or 'empty list'}; choose from {', '.join(STRATEGIES)}")
    for flag, value, low in (("--nproc", args.nproc, 2), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                             ("--requests", args.requests, 1), ("--max-tokens", args.max_tokens, 1),
                             ("--repeats", args.repeats, 1)):
        if value < low:
            _fail(f"{flag} must be >= {low}, got {value}")
    if args.heads < 1 or args.hidden_size % args.heads:
        _fail(f"--heads {args.heads} must divide --hidden-size {args.hidden_size}")
    if any(n in ("tp", "tp-sp") for n in names) and args.heads % args.nproc:
        _fail(f"tp runs {args.nproc}-way: --heads {args.heads} must be a multiple of --nproc {args.nproc}")
    if "pp" in names and args.layers % args.nproc:
        _fail(f"pp runs {args.nproc} stages: --layers {args.layers} must be a multiple of --nproc {args.nproc}")
    if "pp" in names and (args.micro_batch_size * args.nproc) % (2 * args.nproc):
        _fail(f"pp cuts the global batch ({args.micro_batch_size} x {args.nproc}) into {2 * args.nproc} "
              f"micro-batches: make --micro-batch-size even")
    try:
        devices = [int(d) for d in args.devices.split(",")]
    except ValueError:
        _fail(f"--devices must be comma-separated integers, got {args.devices!r}")
    return names, devices


def _layout(spec: CompareSpec) -> tuple[list[int], list[int]]:
    from harness.pipelines.compare.strategies import llama

    model = llama(spec)
    numels = [p.numel() for p in model.parameters()]
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    return numels, [sum(numels) - sum(layers), *layers]


def annotate(name: str, r: dict, spec: CompareSpec, n: int, devices: list[int], budget: float,
             zero_collectives: str) -> None:
    """The formula cells, the exact-count check, lines of code and the scale column, added to a result."""
    from harness.pipelines.compare import loc

    psi, (numels, units) = r["num_params"], _layout(spec)
    shape = {"layers": spec.num_hidden_layers, "batch": spec.global_batch(n), "seq": spec.seq_length,
             "hidden": spec.hidden_size}
    stage = {"torch-ddp": 0, "pt-dist-ddp": 0, "zero-1": 1, "zero-2": 2, "zero-2-offload": 2, "zero-3": 3,
             "pt-dist-fsdp": 3, "torch-fsdp2": 3, "deepspeed-zero-2": 2, "deepspeed-zero-3": 3}.get(name)
    if stage is not None:
        k = 12 if "zero" in name else 8
        f = formulas.zero_memory(psi, n, stage, p=4, g=4, k=k)
        r["memory_formula"] = f"{sum(f.values()) / 1e6:.2f} ((4+4+{k})Ψ, ZeRO-{stage} split)"
        r["paper_volume"] = f"{formulas.PAPER_VOLUME_PSI[name]}Ψ"
    elif name in ("tp", "tp-sp"):
        r["paper_volume"] = f"{formulas.tp_paper_volume(shape) / (4 * psi):.2f}Ψ (4 all-reduces of bsh per layer)"
    elif name == "pp":
        r["paper_volume"] = f"{formulas.pp_paper_volume(shape, n) / n / (4 * psi):.3f}Ψ (bsh per boundary, 2 ways)"
    try:
        want = formulas.expected_comm(name, n, shape, numels, units, zero_collectives=zero_collectives)
        got = {op: v["payload_bytes"] for op, v in r["comm"]["by_op"].items() if op != "barrier"}
        r["exact_check"] = "equal" if got == want else f"differs: {got} vs {want}"
    except KeyError:
        r["exact_check"] = ""
    r["loc"] = loc.strategy_loc(name)["lines"] if name in loc.FILES else None
    per_param = formulas.bytes_per_param(name, r["memory"], psi, n)
    r["scale"] = {str(d): formulas.largest_model(name, per_param, d, budget) for d in devices}
    r["comm_visible"] = name != "torch-ddp"  # torch's DDP waits for its buckets in C++


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names, devices = validate(args)
    try:
        return _run(args, names, devices, argv)
    finally:
        from harness.ranks import shutdown

        shutdown()  # the pooled ranks, before interpreter exit (multiprocessing's exit hook would wait for them)


def _run(args, names: list[str], devices: list[int], argv) -> int:
    from harness.ranks import run_ranks

    spec = CompareSpec(hidden_size=args.hidden_size, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                       intermediate_size=int(args.hidden_size * 2.75) // 8 * 8, vocab_size=args.vocab_size,
                       seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
                       options={"zero_collectives": args.zero_collectives})
    results = {}
    t0 = time.perf_counter()
    for name in names:
        print(f"[{time.perf_counter() - t0:6.1f}s] {STRATEGIES[name][2]} on {args.nproc} ranks ...", flush=True)
        # DeepSpeed keeps its process groups in module globals: it gets new rank processes
        r = run_ranks(run_strategy, args.nproc, name, spec.as_dict(), args.steps, args.warmup, backend="gloo",
                      timeout=1800, fresh=name.startswith("deepspeed"))[0]
        annotate(name, r, spec, args.nproc, devices, args.budget_gb * 1e9, args.zero_collectives)
        results[name] = r
    inference = None
    if not args.skip_inference:
        from harness.pipelines.compare.inference import build_checkpoint, compare_inference

        print(f"[{time.perf_counter() - t0:6.1f}s] inference: paged-serve vs transformers ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            build_checkpoint(tmp, spec)
            inference = compare_inference(tmp, spec, args.requests, args.max_tokens, args.batch_size, args.kv_budget,
                                          args.repeats)
    shape = {"layers": spec.num_hidden_layers, "batch": spec.global_batch(args.nproc), "seq": spec.seq_length,
             "hidden": spec.hidden_size}
    meta = {"world_size": args.nproc, "devices": devices, "shape": shape, "scale_assumptions": SCALE_ASSUMPTIONS,
            "spec": spec.as_dict(), "steps": args.steps, "warmup": args.warmup,
            "command": "miniframes-compare " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "description": (f"One Llama-shaped model ({spec.num_hidden_layers} layers, hidden {spec.hidden_size}, "
                            f"vocabulary {spec.vocab_size}), {args.nproc} ranks on gloo (CPU), global batch "
                            f"{spec.global_batch(args.nproc)} x {spec.seq_length} tokens, fp32, AdamW; "
                            f"{args.steps} measured steps after {args.warmup} warm-up. Peers: "
                            f"{', '.join(STRATEGIES[p][2] for p in PEERS if p in names) or 'none'}.")}
    report.write(args.out, meta, results, inference)
    print(report.terminal_summary(results))
    print(f"report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
