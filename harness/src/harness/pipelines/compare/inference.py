"""The inference table: paged-serve vs transformers' static batching (``generate`` on padded batches) vs
transformers' continuous batching (``generate_batch``), same checkpoint, same seeded workload, greedy.

KV memory waste is allocated token slots minus used ones, over allocated: for paged-serve from its block manager
at every step (slots in the blocks live sequences hold); for static batching from the batch's shape (every row
holds ``longest prompt + max_new_tokens`` slots). The most sequences a fixed KV budget holds at once is measured for
paged-serve (the scheduler's running set with that many blocks) and computed for static batching (a row reserves
the longest sequence). transformers' continuous batching exposes no slot accounting: its cells say so.
TensorRT-LLM and TGI (the seed's other columns) need a CUDA GPU and a server install: not run here.
"""

from __future__ import annotations

import statistics
import time

import torch


def build_checkpoint(path, spec) -> None:
    """A random-weight Llama with a word-level tokenizer, written with transformers (what every engine loads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(spec.vocab_size)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t0", eos_token="t1").save_pretrained(path)
    torch.manual_seed(spec.seed)
    config = LlamaConfig(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                         num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
                         num_key_value_heads=spec.num_attention_heads, vocab_size=spec.vocab_size,
                         max_position_embeddings=4 * spec.seq_length, bos_token_id=0, eos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(path)


def workload(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return [torch.randint(2, vocab, (k,), generator=gen).tolist() for k in lengths]


def run_paged(path, prompts, max_tokens, block_size=16, num_gpu_blocks=None) -> dict:
    from paged_serve import LLM, RequestOutputKind, SamplingParams

    kwargs = {"block_size": block_size}
    if num_gpu_blocks:
        kwargs["num_gpu_blocks"] = num_gpu_blocks
    llm = LLM(path, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=params, use_tqdm=False)  # warm-up
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", prompt_token_ids=p, params=params)
    done, util, running = {}, [], 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (time.perf_counter() - start, len(out.outputs[0].token_ids))
        running = max(running, len(engine.scheduler.running))
        if engine.scheduler.running:
            util.append(engine.scheduler.block_manager.get_kv_utilization())
    seconds = time.perf_counter() - start
    latencies = [done[f"r{i}"][0] for i in range(len(prompts))]
    return {"seconds": seconds, "tokens": sum(v[1] for v in done.values()), "latencies": latencies,
            "kv_waste": 1 - statistics.fmean(util), "max_running": running}


@torch.inference_mode()
def run_static(model, prompts, max_tokens, batch_size) -> dict:
    latencies, tokens, alloc, used = [], 0, 0, 0
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch = prompts[b:b + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
        tokens += out[:, width:].numel()
        alloc += len(batch) * (width + max_tokens)
        used += sum(len(p) + max_tokens for p in batch)
        latencies += [time.perf_counter() - start] * len(batch)  # a batch's requests all finish with it
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "latencies": latencies,
            "kv_waste": 1 - used / alloc}


@torch.inference_mode()
def run_continuous(model, prompts, max_tokens, kv_tokens: int) -> dict:
    """``kv_tokens`` sizes transformers' paged cache (left alone, it takes 90% of free memory: on CPU, of RAM)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=max(1, kv_tokens // 16), max_batch_tokens=512)
    model.generate_batch(prompts[:2], generation_config=config, continuous_batching_config=cb)  # warm-up
    start = time.perf_counter()
    result = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": sum(len(o.generated_tokens) for o in result.values()),
            "latencies": None, "kv_waste": None}


def percentile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def _median_run(runs: list[dict]) -> dict:
    """The run with the median time (its latencies and counts with it), all the runs' times kept."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    out = dict(ordered[len(ordered) // 2])
    out["all_seconds"] = [r["seconds"] for r in runs]
    return out


def compare_inference(path, spec, requests: int, max_tokens: int, batch_size: int, kv_budget_tokens: int,
                      repeats: int = 3) -> dict:
    """Every engine on the same workload, ``repeats`` times interleaved (medians: these machines are noisy);
    ``kv_budget_tokens`` is the fixed KV pool for the concurrency row."""
    from transformers import AutoModelForCausalLM

    prompts = workload(requests, 8, 2 * spec.seq_length, spec.vocab_size, spec.seed)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    block = 16
    everyone = sum(-(-(len(p) + max_tokens) // block) for p in prompts)  # blocks for all requests at once
    engines = {
        "paged-serve": lambda: run_paged(path, prompts, max_tokens, block, num_gpu_blocks=everyone),
        "transformers static batching": lambda: run_static(model, prompts, max_tokens, batch_size),
        "transformers continuous batching": lambda: run_continuous(model, prompts, max_tokens, everyone * block),
    }
    runs = {name: [] for name in engines}
    for _ in range(repeats):
        for name, fn in engines.items():
            runs[name].append(fn())
    rows = {name: _median_run(r) for name, r in runs.items()}
    budgeted = run_paged(path, prompts, max_tokens, block, num_gpu_blocks=kv_budget_tokens // block)
    rows["paged-serve"]["max_concurrent"] = budgeted["max_running"]
    longest = max(map(len, prompts)) + max_tokens
    rows["transformers static batching"]["max_concurrent"] = kv_budget_tokens // longest
    rows["transformers continuous batching"]["max_concurrent"] = None
    for r in rows.values():
        r["throughput"] = r["tokens"] / r["seconds"]
        lat = r.pop("latencies")
        r["p50"], r["p99"] = (percentile(lat, 0.5), percentile(lat, 0.99)) if lat else (None, None)
    return {"requests": requests, "max_tokens": max_tokens, "batch_size": batch_size, "repeats": repeats,
            "kv_budget_tokens": kv_budget_tokens, "prompt_lengths": [min(map(len, prompts)), longest - max_tokens],
            "engines": rows}
