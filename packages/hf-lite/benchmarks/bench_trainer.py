"""hf-lite's Trainer against a hand-written torch loop (overhead) and against transformers' Trainer (throughput).

All three train the same Llama on the same token blocks with the same AdamW, linear schedule, clipping and batch
order; the script first checks that hf-lite's and transformers' losses agree, then alternates the sides and reports
medians. It measures CPU time with one torch thread (``time.process_time``), which stays stable on a shared machine
where wall-clock time does not. transformers' Trainer needs ``accelerate``: run with ``uv run --with accelerate``;
without it that row says so and the overhead row still runs.

    uv run --with accelerate python packages/hf-lite/benchmarks/bench_trainer.py   (--quick: a smoke run)
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import tempfile
import time
from functools import partial

import torch
from hf_lite import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, get_scheduler

CONFIG = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def make_data(n: int, seq: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (n, seq), generator=g)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def fresh_model(directory: str) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(directory)


def common_args(out: str, steps: int, batch: int) -> dict:
    return dict(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=1e-3,
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_pin_memory=False,
    )


def run_hf_lite(model_dir, data, steps, batch) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(
            fresh_model(model_dir), TrainingArguments(**common_args(out, steps, batch)), train_dataset=data
        )
        start = time.process_time()
        trainer.train()
        cpu = time.process_time() - start
    return cpu, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def run_transformers(model_dir, data, steps, batch, same_model: bool = False) -> tuple[float, list[float]]:
    """transformers' Trainer on transformers' Llama, or (``same_model``) on hf-lite's: the Trainers alone compared."""
    import transformers

    with tempfile.TemporaryDirectory() as out:
        if same_model:
            model = fresh_model(model_dir)
            model.loss_type = "ForCausalLM"  # so transformers counts label tokens as for its own causal LMs
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
        trainer = transformers.Trainer(
            model=model, args=transformers.TrainingArguments(**common_args(out, steps, batch)), train_dataset=data
        )
        start = time.process_time()
        trainer.train()
        cpu = time.process_time() - start
    return cpu, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def run_torch_loop(model_dir, data, steps, batch) -> tuple[float, list[float]]:
    """What one writes by hand: same sampler order, AdamW groups, schedule and clipping; no callbacks or logs."""
    model = fresh_model(model_dir).train()
    start = time.process_time()
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, fused=True
    )
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=steps)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
    losses, step, epoch = [], 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for batch_ in loader:
            loss = model(**batch_).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
            losses.append(loss.detach())
            step += 1
            if step == steps:
                break
        epoch += 1
    cpu = time.process_time() - start
    return cpu, [x.item() for x in losses]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per measurement")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="measurements per side (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="5 steps, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 5, 1
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    have_transformers = importlib.util.find_spec("accelerate") is not None
    data = make_data(args.steps * args.batch, args.seq)
    with tempfile.TemporaryDirectory() as model_dir:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(model_dir)
        sides = {"hf-lite Trainer": run_hf_lite, "torch loop": run_torch_loop}
        if have_transformers:
            sides["transformers Trainer"] = run_transformers
            sides["transformers Trainer, hf-lite model"] = partial(run_transformers, same_model=True)
        warm = {name: fn(model_dir, data, 2, args.batch) for name, fn in sides.items()}  # imports, first kernels
        if have_transformers:
            ours_l, theirs_l = (
                run_hf_lite(model_dir, data, 10, args.batch)[1],
                run_transformers(model_dir, data, 10, args.batch)[1],
            )
            same_l = run_transformers(model_dir, data, 10, args.batch, same_model=True)[1]
            torch.testing.assert_close(ours_l, theirs_l, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(ours_l, same_l, rtol=1e-4, atol=1e-5)
        del warm
        times = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, fn in sides.items():
                times[name].append(fn(model_dir, data, args.steps, args.batch)[0])
    med = {name: statistics.median(t) for name, t in times.items()}
    tokens = args.steps * args.batch * args.seq
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), Llama {CONFIG['num_hidden_layers']} layers "
        f"d={CONFIG['hidden_size']} vocab {CONFIG['vocab_size']}, batch {args.batch}x{args.seq}, {args.steps} steps, "
        f"median of {args.repeats} CPU-time measurements"
    )
    print("| measurement                                   |    hf-lite |  reference | result |")
    print("|-----------------------------------------------|------------|------------|--------|")
    ours, loop = med["hf-lite Trainer"], med["torch loop"]
    print(
        f"| CPU ms per step vs hand-written torch loop    | {1e3 * ours / args.steps:10.2f} | "
        f"{1e3 * loop / args.steps:10.2f} | {100 * (ours / loop - 1):+5.1f}% |"
    )
    if have_transformers:
        theirs = med["transformers Trainer"]
        print(
            f"| training tokens/CPU-s vs transformers Trainer | {tokens / ours:10.0f} | {tokens / theirs:10.0f} | "
            f"{theirs / ours:5.2f}x |"
        )
        same = med["transformers Trainer, hf-lite model"]
        print(
            f"| same, both Trainers on hf-lite's Llama        | {tokens / ours:10.0f} | {tokens / same:10.0f} | "
            f"{same / ours:5.2f}x |"
        )
    else:
        print(
            "| training tokens/CPU-s vs transformers Trainer | (transformers' Trainer needs accelerate: "
            "uv run --with accelerate ...) |"
        )
    spread = {name: f"{min(t) / med[name]:.2f}-{max(t) / med[name]:.2f}" for name, t in times.items()}
    print(f"spread (min/median - max/median): {spread}")


if __name__ == "__main__":
    main()
