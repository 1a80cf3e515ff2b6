"""KV-cache utilisation: paged blocks (BlockSpaceManager) vs contiguous max-length reservation (static batching).

A mixed-length workload (log-normal prompt and output lengths, as in chat traces) is decoded step by step. Paged:
each sequence holds ceil(len / block_size) blocks and returns them when it finishes; utilisation is tokens stored
/ token slots held, averaged over the steps. Contiguous: every request of the batch reserves ``max_model_len``
slots (or prompt + max_tokens, the better static variant) until the whole batch finishes. Bytes are the sum of
the KV tensors' bytes a Llama-3-8B-shaped model (32 layers, 8 KV heads, head size 128, bf16) would need.

    uv run python packages/paged-serve/benchmarks/bench_kv_utilization.py
"""

from __future__ import annotations

import argparse
import math
import random

from paged_serve.core import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus

BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, layers, kv heads, head size, bf16


def workload(num_requests: int, max_model_len: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(num_requests):
        prompt = min(max_model_len // 2, max(4, int(rng.lognormvariate(math.log(200), 0.9))))
        output = min(max_model_len - prompt, max(1, int(rng.lognormvariate(math.log(150), 0.8))))
        reqs.append((prompt, output))
    return reqs


def run_paged(reqs, block_size: int, max_model_len: int) -> tuple[float, float]:
    """Step-averaged stored/held ratio and peak held bytes, with sequences freed as they finish."""
    num_blocks = sum(math.ceil((p + o) / block_size) for p, o in reqs)
    manager = BlockSpaceManager(block_size, num_blocks, 0, watermark=0.0)
    seqs = []
    for i, (prompt, output) in enumerate(reqs):
        seq = Sequence(i, [1] * prompt, block_size)
        manager.allocate(SequenceGroup(str(i), [seq]))
        seq.status = SequenceStatus.RUNNING
        seqs.append((seq, output))
    stored = held = peak = 0
    while seqs:
        util = manager.get_kv_utilization()
        blocks = manager.gpu_allocator.get_num_total_blocks() - manager.get_num_free_gpu_blocks()
        step_held = blocks * block_size
        stored += util * step_held
        held += step_held
        peak = max(peak, step_held)
        alive = []
        for seq, output in seqs:
            if seq.get_output_len() >= output:
                manager.free(seq)
                continue
            seq.append_token_id(1)
            manager.append_slots(seq)
            alive.append((seq, output))
        seqs = alive
    return stored / held, peak * BYTES_PER_TOKEN


def run_contiguous(reqs, reserve) -> tuple[float, float]:
    """Static batching: each request reserves ``reserve(prompt, output)`` slots until the longest one finishes."""
    steps = max(o for _, o in reqs)
    reserved = sum(reserve(p, o) for p, o in reqs)
    stored = sum(sum(p + min(t, o) for p, o in reqs) for t in range(steps + 1))
    return stored / (reserved * (steps + 1)), reserved * BYTES_PER_TOKEN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=512, help="static reservation of output slots per request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reqs = workload(args.num_requests, args.max_model_len, args.seed)
    mean_len = sum(p + o for p, o in reqs) / len(reqs)
    print(f"{len(reqs)} requests, mean final length {mean_len:.0f} tokens, max_model_len {args.max_model_len}")
    print("| allocation | KV utilisation (stored / reserved) | peak KV reserved (GiB) | vs paged bs=16 |")
    print("|---|---|---|---|")
    rows = []
    for block_size in (8, 16, 32):
        rows.append((f"paged, block_size={block_size}", *run_paged(reqs, block_size, args.max_model_len)))
    rows.append(("contiguous, max_model_len per request", *run_contiguous(reqs, lambda p, o: args.max_model_len)))
    cap = args.max_tokens
    rows.append((f"contiguous, prompt + max_tokens={cap}", *run_contiguous(reqs, lambda p, o: p + max(cap, o))))
    ref = rows[1][2]
    for name, util, peak in rows:
        print(f"| {name} | {util:.1%} | {peak / 2**30:.1f} | {peak / ref:.2f}x |")


if __name__ == "__main__":
    main()
