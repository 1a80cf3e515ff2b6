"""Benchmark hf-lite against transformers / tokenizers on the same work, in one run, on CPU.

* greedy ``generate`` tokens/s at batch 1 and 8 (same weights: saved by hf-lite, loaded by transformers)
* forward latency (one prefill forward)
* tokenizer throughput in MB/s: pure-Python BPE vs PreTrainedTokenizerFast vs the raw ``tokenizers`` library,
  on a BPE trained here on the Python standard library's own source.

Prints a table of medians with hf-lite / reference ratios. Usage: ``uv run python bench_generate.py [--quick]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sysconfig
import tempfile
import time

import torch


def paired_median_times(fn_ours, fn_ref, repeats: int) -> tuple[float, float]:
    """Median CPU seconds (``time.process_time``) of each side, alternating them.

    CPU time, not wall time: on a shared machine other processes stretch wall time by several x from one repeat to
    the next, while the CPU time this process spends on the work stays put."""
    fn_ours(), fn_ref()  # warm-up
    ours, ref = [], []
    for _ in range(repeats):
        for fn, times in ((fn_ours, ours), (fn_ref, ref)):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
    return statistics.median(ours), statistics.median(ref)


def bench_models(args, rows):
    import transformers
    from hf_lite import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    configs = {
        "gpt2": (
            GPT2LMHeadModel,
            GPT2Config(
                vocab_size=8000, n_positions=512, n_embd=256, n_layer=4, n_head=8, bos_token_id=0, eos_token_id=0
            ),
        ),
        "llama": (
            LlamaForCausalLM,
            LlamaConfig(
                vocab_size=8000,
                hidden_size=256,
                intermediate_size=688,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=4,
                max_position_embeddings=512,
            ),
        ),
    }
    for name, (cls, config) in configs.items():
        torch.manual_seed(0)
        ours = cls(config).eval()
        with tempfile.TemporaryDirectory() as d:
            ours.save_pretrained(d)
            theirs = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
        for batch in (1, 8):
            ids = torch.randint(0, 8000, (batch, args.prompt_len), generator=torch.Generator().manual_seed(batch))
            kw = dict(
                max_new_tokens=args.new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                attention_mask=torch.ones_like(ids),
            )
            a = ours.generate(ids, **kw)
            b = theirs.generate(ids, **kw)
            assert torch.equal(a, b), f"{name} batch {batch}: outputs differ"
            t_ours, t_theirs = paired_median_times(
                lambda m=ours, ids=ids, kw=kw: m.generate(ids, **kw),
                lambda m=theirs, ids=ids, kw=kw: m.generate(ids, **kw),
                args.repeats,
            )
            n = batch * args.new_tokens
            label = f"{name} greedy generate, batch {batch} (tokens/CPU-s)"
            rows.append((label, n / t_ours, n / t_theirs, "transformers"))
        ids = torch.randint(0, 8000, (8, 128), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            t_ours, t_theirs = paired_median_times(
                lambda m=ours, ids=ids: m(input_ids=ids, use_cache=False),
                lambda m=theirs, ids=ids: m(input_ids=ids, use_cache=False),
                args.repeats,
            )
        rows.append((f"{name} forward 8x128 CPU time (ms)", t_ours * 1e3, t_theirs * 1e3, "transformers"))


def bench_tokenizers(args, rows):
    from hf_lite import GPT2Tokenizer, PreTrainedTokenizerFast
    from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    texts = [open(f, encoding="utf-8", errors="replace").read() for f in files]
    train, test = texts[: len(texts) // 2], texts[len(texts) // 2 :]
    tok = byte_level_bpe_tokenizer()
    tok.train_from_iterator(
        train,
        trainers.BpeTrainer(
            vocab_size=4000,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    budget, sample = args.tokenizer_mb * 1e6, []
    for t in test:
        if sum(len(s.encode()) for s in sample) >= budget:
            break
        sample.append(t)
    mb = sum(len(s.encode()) for s in sample) / 1e6
    with tempfile.TemporaryDirectory() as d:
        tok.save(os.path.join(d, "tokenizer.json"))
        rust = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        fast = PreTrainedTokenizerFast.from_pretrained(d)
        pure = GPT2Tokenizer.from_pretrained(d)

    def run_pure():
        pure.cache.clear()  # measure BPE work, not a warm cache from the previous repeat
        return [pure.encode(s) for s in sample]

    ids_pure = run_pure()
    assert ids_pure == [e.ids for e in rust.encode_batch(sample)], "pure and Rust ids differ"
    t_pure, t_rust = paired_median_times(run_pure, lambda: rust.encode_batch(sample), args.repeats)
    t_fast, t_rust2 = paired_median_times(
        lambda: fast(sample)["input_ids"], lambda: rust.encode_batch(sample), args.repeats
    )
    rows.append((f"tokenizer pure-Python BPE ({mb:.2f} MB, MB/CPU-s)", mb / t_pure, mb / t_rust, "tokenizers"))
    rows.append(("tokenizer PreTrainedTokenizerFast (MB/CPU-s)", mb / t_fast, mb / t_rust2, "tokenizers"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median reported)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--tokenizer-mb", type=float, default=0.5, help="MB of stdlib source to tokenize")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: CPU time = work)")
    parser.add_argument("--quick", action="store_true", help="fewer tokens, smaller tokenizer sample")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.tokenizer_mb, args.repeats = 16, 0.2, 2
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    rows: list[tuple[str, float, float, str]] = []
    bench_models(args, rows)
    bench_tokenizers(args, rows)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, median of {args.repeats} CPU-time measurements (per CPU-second rates)"
    )
    print(f"| {'measurement':<52} | {'hf-lite':>10} | {'reference':>10} | {'ratio':>6} | reference |")
    print(f"|{'-' * 54}|{'-' * 12}|{'-' * 12}|{'-' * 8}|-----------|")
    for name, ours, ref, ref_name in rows:
        ratio = ref / ours if "CPU time (ms)" in name else ours / ref  # > 1 means hf-lite is better
        print(f"| {name:<52} | {ours:>10.1f} | {ref:>10.1f} | {ratio:>5.2f}x | {ref_name} |")


if __name__ == "__main__":
    main()
