"""The realistic workloads of ``bench_serving.py``: mixed output lengths, a fixed KV-memory budget, and staggered
(Poisson) arrivals through the server. Static batching must run each batch until its longest request is done, and
under a KV budget it must reserve every row's full length up front; paged-serve holds only the blocks in use."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
import time

import torch


def mixed_lengths(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts of 16-256 tokens, each request its own max_tokens, log-uniform in 8-256."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 257, (n,), generator=gen).tolist()
    prompts = [torch.randint(2, vocab, (k,), generator=gen).tolist() for k in lengths]
    u = torch.rand(n, generator=gen).tolist()
    return prompts, [int(round(math.exp(math.log(8) + x * (math.log(256) - math.log(8))))) for x in u]


def sharegpt_like(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """ShareGPT-shaped lengths made locally: log-normal prompts (median ~90 tokens) and outputs (median ~120),
    clipped to 8-400 and 8-256 (nothing is downloaded)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.empty(n).log_normal_(math.log(90), 0.9, generator=gen).clamp(8, 400).long().tolist()
    o = torch.empty(n).log_normal_(math.log(120), 0.8, generator=gen).clamp(8, 256).long().tolist()
    return [torch.randint(2, vocab, (k,), generator=gen).tolist() for k in p], o


def run_paged_mixed(path, prompts, max_tokens, **engine_args):
    """(seconds, outputs, stats, peak and mean sequences running at once, mean KV utilisation), greedy, one
    request per prompt."""
    from paged_serve import LLM, SamplingParams

    llm = LLM(path, **engine_args)
    engine = llm.llm_engine
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=warm, use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    for p in params:
        p.output_kind = p.output_kind.FINAL_ONLY
    for i, (ids, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", prompt_token_ids=ids, params=p)
    outputs, running, util = {}, [], []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        running.append(sum(g.num_unfinished_seqs() for g in engine.scheduler.running))
        if engine.scheduler.running:
            util.append(engine.scheduler.block_manager.get_kv_utilization())
    elapsed = time.perf_counter() - start
    outs = [outputs[f"r{i}"] for i in range(len(prompts))]
    return elapsed, outs, llm.get_stats(), max(running), statistics.fmean(running), statistics.fmean(util)


def static_batches(prompts, max_tokens, batch_size=None, kv_slots=None):
    """Arrival-order batches: a fixed size, or as many rows as fit ``kv_slots`` when every row reserves the
    batch's padded prompt width plus its longest max_tokens (a contiguous KV cache)."""
    batches, cur = [], []
    for i in range(len(prompts)):
        trial = cur + [i]
        if batch_size is not None:
            fits = len(trial) <= batch_size
        else:
            fits = len(trial) * (max(len(prompts[j]) for j in trial) + max(max_tokens[j] for j in trial)) <= kv_slots
        if cur and not fits:
            batches.append(cur)
            trial = [i]
        cur = trial
    return batches + ([cur] if cur else [])


@torch.inference_mode()
def run_hf_static_mixed(model, prompts, max_tokens, batches):
    """transformers ``generate`` on left-padded batches, each run to its longest max_tokens, cut per request."""
    outs = [None] * len(prompts)
    start = time.perf_counter()
    for batch in batches:
        width = max(len(prompts[i]) for i in batch)
        ids = torch.tensor([[0] * (width - len(prompts[i])) + prompts[i] for i in batch])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch])
        new = max(max_tokens[i] for i in batch)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0, eos_token_id=None)  # fmt: skip
        for row, i in enumerate(batch):
            outs[i] = out[row, width : width + max_tokens[i]].tolist()
    return time.perf_counter() - start, outs


class LocalServer:
    """paged-serve's OpenAI server on a loopback port in a thread; ``with`` stops it and its engine."""

    def __init__(self, path, max_waiting_requests, **engine_args):
        import uvicorn
        from paged_serve import EngineArgs
        from paged_serve.engine.async_llm_engine import AsyncLLMEngine
        from paged_serve.entrypoints.openai.api_server import bind_socket, build_app

        self.engine = AsyncLLMEngine.from_engine_args(EngineArgs(path, **engine_args), max_waiting_requests)
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.engine, "bench"), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()


def percentile(xs, p):
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def server_poisson(path, prompts, max_tokens, clients, rate, seed=0, **engine_args):
    """Each of ``clients`` streams its share of the requests, waiting an exponential gap (``rate`` requests/s per
    client, fixed seed) before each: time to first token and time per output token, p50 / p99."""
    import httpx

    gen = torch.Generator().manual_seed(seed)
    gaps = torch.empty(len(prompts)).exponential_(rate, generator=gen).tolist()
    ttft, tpot = [], []

    async def client(http, mine):
        for i in mine:
            await asyncio.sleep(gaps[i])
            body = {"prompt": prompts[i], "max_tokens": max_tokens[i], "temperature": 0, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            start, first, count = time.perf_counter(), None, 0
            async with http.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                        count += 1
                        first = first or time.perf_counter() - start
            total = time.perf_counter() - start
            ttft.append(first or total)
            if max_tokens[i] > 1:
                tpot.append((total - ttft[-1]) / (max_tokens[i] - 1))

    async def main():
        limits = httpx.Limits(max_connections=clients + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as http:
            await asyncio.gather(*(client(http, range(c, len(prompts), clients)) for c in range(clients)))

    with LocalServer(path, len(prompts), **engine_args) as server:
        asyncio.run(main())
    q = percentile
    return {"ttft_p50": q(ttft, 0.5), "ttft_p99": q(ttft, 0.99), "tpot_p50": q(tpot, 0.5), "tpot_p99": q(tpot, 0.99)}
