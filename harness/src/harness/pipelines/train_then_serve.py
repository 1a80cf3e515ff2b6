"""``train-then-serve``: train a small Llama on local text with one of the training packages, then serve it.

    uv run train-then-serve                                   # hf-lite Trainer + torch DDP, 2 local ranks, CPU
    uv run train-then-serve --trainer ds-zero --zero-stage 3  # or mega-par --tp 2 [--sp], ...
    uv run train-then-serve --serve-tensor-parallel 2         # paged-serve serves it on 2 tensor-parallel ranks
    torchrun --nnodes 2 --nproc-per-node 4 -m harness.pipelines.train_then_serve --trainer ds-zero

Steps: train a byte-level BPE tokenizer (hf-lite) on the corpus (Python's standard library sources unless
``--corpus``); train the model on ``--nproc`` ranks (spawned here, or the ones torchrun started); write a Hugging
Face checkpoint with the trainer package's own converter; load it into paged-serve and generate continuations of a
few prompts in one continuous batch (or ``--serve`` the OpenAI API). Every argument is checked before any process
starts; Ctrl-C leaves no rank process and no half-written checkpoint (it is written to ``checkpoint.partial`` and
renamed when complete).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from harness.pipelines.presets import PRESETS, TrainSpec
from harness.pipelines.trainers import TRAINERS, NotBuiltError, get_trainer

logger = logging.getLogger("train-then-serve")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train-then-serve",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--trainer", default="hf-lite", choices=sorted(TRAINERS), help="which package trains")
    p.add_argument("--nproc", type=int, default=2, help="local ranks to spawn (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--model-size", default="tiny", choices=sorted(PRESETS))
    p.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="a text file or a directory of .py files (default: this Python's standard library)",
    )
    p.add_argument("--corpus-bytes", type=int, default=1_500_000, help="characters of corpus to use")
    p.add_argument("--out", type=Path, default=Path("train-then-serve-out"), help="output directory")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zero-stage", type=int, default=2, help="ds-zero: ZeRO stage 0-3")
    p.add_argument("--offload", default="none", choices=["none", "cpu", "nvme"], help="ds-zero: optimizer offload")
    p.add_argument("--tp", type=int, default=1, help="mega-par: tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="mega-par: pipeline-parallel size")
    p.add_argument("--sp", action="store_true", help="mega-par: sequence parallelism (needs --tp > 1)")
    p.add_argument("--save-steps", type=int, default=0, help="hf-lite: keep a resumable checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="hf-lite: resume from the newest checkpoint in --out")
    p.add_argument("--serve", action="store_true", help="start the OpenAI-compatible server instead of generating")
    p.add_argument(
        "--serve-tensor-parallel",
        type=int,
        default=1,
        help="paged-serve: tensor-parallel size of the served model (worker processes beside this one)",
    )
    p.add_argument("--host", default="127.0.0.1", help="--serve: address to bind")
    p.add_argument("--port", type=int, default=8000, help="--serve: port")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens generated per prompt")
    return p


def _fail(message: str) -> None:
    print(f"train-then-serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _check_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        _fail(f"--out {out} is not writable ({exc.strerror or exc})")


def _torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and "TORCHELASTIC_RUN_ID" in os.environ


def validate(args) -> None:
    """Every bad argument, in one line each, before anything starts."""
    import torch

    for name in ("nproc", "steps", "batch_size", "corpus_bytes", "max_new_tokens", "serve_tensor_parallel"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lr <= 0:
        _fail(f"--lr must be > 0, got {args.lr}")
    if args.corpus is not None and not args.corpus.exists():
        _fail(f"--corpus {args.corpus} does not exist")
    if args.device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda but no CUDA device is available")
    if args.save_steps < 0:
        _fail(f"--save-steps must be >= 0, got {args.save_steps}")
    if (args.resume or args.save_steps) and args.trainer != "hf-lite":
        _fail(f"--resume and --save-steps are for --trainer hf-lite (the Trainer's checkpoints), not {args.trainer}")
    if args.resume and not any((args.out / "hf_lite_trainer").glob("checkpoint-*")):
        _fail(f"--resume: no checkpoint-* under {args.out / 'hf_lite_trainer'} to resume from")
    preset, tp = PRESETS[args.model_size], args.serve_tensor_parallel
    heads, kv_heads = preset.num_attention_heads, preset.num_key_value_heads
    if heads % tp or (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
        _fail(f"--serve-tensor-parallel {tp} does not split the {args.model_size} model's {heads} heads / "
              f"{kv_heads} KV heads evenly")  # fmt: skip
    if not 0 < args.port < 65536:
        _fail(f"--port must be in 1..65535, got {args.port}")
    _check_out(args.out)


def _spec(args, tokenizer, device: str, nproc: int) -> TrainSpec:
    preset = PRESETS[args.model_size]
    preset = type(preset)(**{**preset.__dict__, "vocab_size": len(tokenizer)})
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    options = {
        "trainer": args.trainer,
        "zero_stage": args.zero_stage,
        "offload": args.offload,
        "tp": args.tp,
        "pp": args.pp,
        "sp": args.sp,
        "nproc": nproc,
        "save_steps": args.save_steps,
        "resume": args.resume,
    }
    return TrainSpec(
        out_dir=str(args.out),
        tokenizer_dir=str(args.out / "tokenizer"),
        checkpoint_dir=str(args.out / "checkpoint.partial"),
        model=preset,
        bos_token_id=eos,
        eos_token_id=eos,
        steps=args.steps,
        micro_batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=max(1, min(10, args.steps // 10)),
        seed=args.seed,
        device=device,
        options=options,
    )


def _publish(out: Path) -> Path:
    """``checkpoint.partial`` -> ``checkpoint``: the finished directory appears in one rename."""
    final, partial = out / "checkpoint", out / "checkpoint.partial"
    if final.exists():
        old = out / f"checkpoint.old-{os.getpid()}"
        final.rename(old)
        partial.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(final)
    return final


def _train(trainer, spec: TrainSpec, nproc: int) -> dict:
    if _torchrun():
        import torch.distributed as dist

        backend = "nccl" if spec.device == "cuda" else "gloo"
        dist.init_process_group(backend)
        try:
            return trainer.train(dist.get_rank(), dist.get_world_size(), spec.as_dict())
        finally:
            dist.destroy_process_group()
    from harness.ranks import run_ranks

    backend = "nccl" if spec.device == "cuda" else "gloo"
    return run_ranks(trainer.train, nproc, spec.as_dict(), backend=backend, timeout=6 * 3600, fresh=True)[0]


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    validate(args)
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    nproc = int(os.environ["WORLD_SIZE"]) if _torchrun() else args.nproc
    rank = int(os.environ.get("RANK", "0")) if _torchrun() else 0
    trainer = get_trainer(args.trainer)
    from harness.pipelines import corpus, report

    t0 = time.perf_counter()
    shutil.rmtree(args.out / "checkpoint.partial", ignore_errors=True)  # a run interrupted before
    docs = corpus.read_corpus(args.corpus, args.corpus_bytes)
    if rank == 0:
        tokenizer = corpus.train_tokenizer(docs, PRESETS[args.model_size].vocab_size, args.out / "tokenizer")
        tokens = corpus.tokenize(tokenizer, docs, args.out)
    if _torchrun() and nproc > 1:
        import torch.distributed as dist  # the other ranks wait for rank 0's tokenizer and token file

        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
    from hf_lite import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.out / "tokenizer"))
    tokens = torch.load(args.out / "tokens.pt")
    spec = _spec(args, tokenizer, device, nproc)
    try:
        trainer.check(spec)
    except (NotBuiltError, ValueError) as exc:
        _fail(str(exc))
    print(
        f"corpus: {len(docs)} documents, {tokens.numel():,} tokens (BPE vocabulary {len(tokenizer)}); "
        f"training a {args.model_size} Llama with {args.trainer} on {nproc} rank(s), {device}",
        flush=True,
    )
    try:
        result = _train(trainer, spec, nproc)
    except KeyboardInterrupt:
        from harness.ranks import shutdown

        shutdown()
        shutil.rmtree(args.out / "checkpoint.partial", ignore_errors=True)
        print("train-then-serve: interrupted; no checkpoint written", file=sys.stderr)
        return 130
    if rank != 0:
        return 0
    checkpoint = _publish(args.out)
    losses = result["losses"]
    first, last = report.smoothed(losses)
    print("\n" + report.ascii_plot(losses, title=f"training loss ({args.trainer})"))
    png = report.save_loss_png(losses, args.out / "loss_curve.png", f"{args.trainer}: {args.model_size} Llama")
    print(
        f"\nloss {first:.3f} -> {last:.3f} (perplexity {report.perplexity(first):.0f} -> "
        f"{report.perplexity(last):.1f}); checkpoint: {checkpoint}",
        flush=True,
    )
    if args.serve:
        from harness.pipelines.serve import serve

        serve(str(checkpoint), device, args.host, args.port, args.serve_tensor_parallel)
        return 0
    from harness.pipelines.serve import generate

    outputs, stats, seconds = generate(str(checkpoint), device, args.max_new_tokens, args.serve_tensor_parallel)
    print("\n=== generations (paged-serve, one continuous batch, greedy) ===")
    for out in outputs:
        print(f"--- prompt: {out.prompt!r}\n{out.prompt}{out.outputs[0].text}")
    gen_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    rows = [
        ("trainer", f"{args.trainer} on {nproc} rank(s), {device}"),
        ("model", f"{args.model_size} Llama, {_num_parameters(checkpoint):,} parameters"),
        (
            "training",
            f"{len(losses)} steps, {result['tokens']:,} tokens, {result['seconds']:.1f} s "
            f"({result['tokens'] / max(result['seconds'], 1e-9):,.0f} tokens/s)",
        ),
        ("loss", f"{first:.3f} -> {last:.3f}"),
        ("checkpoint", str(checkpoint)),
        (
            "serving",
            f"{len(outputs)} prompts, {gen_tokens} tokens in {seconds:.2f} s "
            f"({gen_tokens / max(seconds, 1e-9):.0f} tokens/s), tensor-parallel {args.serve_tensor_parallel}",
        ),
        (
            "KV utilisation",
            f"{stats['kv_utilization']:.1%} of held slots filled (mean over steps), peak "
            f"{stats['peak_cache_usage']:.1%} of the pool",
        ),
        ("prefix-cache hit rate", f"{stats['prefix_cache_hit_rate']:.1%}"),
        ("preemptions", f"{stats['num_preemptions_recompute']} recompute, {stats['num_preemptions_swap']} swap"),
        ("loss curve", str(png) if png else "(matplotlib missing)"),
        ("total time", f"{time.perf_counter() - t0:.1f} s"),
    ]
    print("\n=== summary ===\n" + report.summary_table(rows))
    return 0


def _num_parameters(checkpoint: Path) -> int:
    import math

    from safetensors import safe_open

    total = 0
    for f in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            total += sum(math.prod(st.get_slice(key).get_shape()) for key in st.keys())
    return total


if __name__ == "__main__":
    sys.exit(main())
