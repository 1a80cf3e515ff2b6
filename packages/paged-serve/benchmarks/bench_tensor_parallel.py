"""Tensor parallelism on this machine: ``tensor_parallel_size=2`` against 1 (time per engine step, KV blocks per rank).

A random Llama checkpoint (saved by transformers into a temporary directory) serves one batch: ``--prompts``
prompts of ``--prompt-len`` tokens, ``--max-tokens`` greedy tokens each. Each ``LLMEngine.step`` is timed; the
first step (the batch's prefill) and the median decode step are reported, each the median over ``--repeats`` runs.
The KV budget is the same number of bytes per rank (``kv_cache_memory_bytes``), so the blocks per rank show what
halving the KV heads per rank buys. Threads (``torch.set_num_threads`` in the driver, ``OMP_NUM_THREADS`` for the
spawned worker): one rank with every core, one rank with half of them, and TP=2 with half per rank.

    uv run python packages/paged-serve/benchmarks/bench_tensor_parallel.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def build_checkpoint(path: str, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=1024)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)


def run(path: str, tp: int, threads: int, args) -> dict:
    from paged_serve import LLM, SamplingParams

    old_threads, old_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        llm = LLM(path, tensor_parallel_size=tp, skip_tokenizer_init=True, kv_cache_memory_bytes=args.kv_bytes,
                  max_num_seqs=args.prompts, max_model_len=512)  # fmt: skip
    finally:
        torch.set_num_threads(old_threads)
        if old_env is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = old_env
    engine = llm.llm_engine
    torch.set_num_threads(threads)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    gen = torch.Generator().manual_seed(1)
    prefills, decodes, outputs = [], [], None
    try:
        for r in range(args.repeats):
            prompts = torch.randint(2, args.vocab, (args.prompts, args.prompt_len), generator=gen).tolist()
            for i, ids in enumerate(prompts):
                engine.add_request(f"{r}-{i}", {"prompt_token_ids": ids}, params)
            times, finished = [], []
            while engine.has_unfinished_requests():
                t0 = time.perf_counter()
                finished += [o for o in engine.step() if o.finished]
                times.append(time.perf_counter() - t0)
            prefills.append(times[0])
            decodes.append(statistics.median(times[1:]))
            if r == 0:
                outputs = sorted((o.request_id, o.outputs[0].token_ids) for o in finished)
        return {
            "tp": tp,
            "threads per rank": threads,
            "prefill step (s)": statistics.median(prefills),
            "decode step (ms)": 1000 * statistics.median(decodes),
            "KV blocks per rank": engine.cache_config.num_gpu_blocks,
            "outputs": outputs,
        }
    finally:
        engine.shutdown()
        torch.set_num_threads(old_threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-bytes", type=int, default=16 << 20, help="KV cache bytes per rank")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as path:
        build_checkpoint(path, args.hidden, args.layers, args.heads, args.kv_heads, args.vocab)
        cores = os.cpu_count() or 1
        rows = [
            run(path, 1, cores, args),
            run(path, 1, max(1, cores // 2), args),
            run(path, 2, max(1, cores // 2), args),
        ]
    print(f"Llama {args.hidden} hidden, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads, "
          f"vocab {args.vocab}, fp32; {args.prompts} prompts x {args.prompt_len} tokens, {args.max_tokens} new; "
          f"median of {args.repeats}; {os.cpu_count()} cores")  # fmt: skip
    print("| tensor_parallel_size | threads per rank | prefill step (s) | decode step (ms) | KV blocks per rank |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['tp']} | {row['threads per rank']} | {row['prefill step (s)']:.3f} | "
              f"{row['decode step (ms)']:.1f} | {row['KV blocks per rank']} |")  # fmt: skip
    decode = [row["decode step (ms)"] for row in rows]
    print(
        f"TP=2 decode step / TP=1's: {decode[2] / decode[0]:.2f}x ({rows[0]['threads per rank']} threads), "
        f"{decode[2] / decode[1]:.2f}x (same threads per rank); greedy outputs identical: "
        f"{rows[0]['outputs'] == rows[1]['outputs'] == rows[2]['outputs']}"
    )


if __name__ == "__main__":
    main()
