"""The client side of vLLM's serving benchmark (``benchmarks/benchmark_serving.py`` with the request functions of
``backend_request_func.py``), rebuilt for paged-serve's server: the ``vllm``, ``openai`` and ``openai-chat``
backends (``vllm`` and ``openai`` send the same completions request, as vLLM's ``ASYNC_REQUEST_FUNCS`` maps
them), random prompts of a fixed length, arrivals all at once or as a Poisson process, an optional concurrency
cap, and benchmark_serving's metrics (request and token throughput; TTFT, TPOT, ITL and E2EL mean / median / p99).

    uv run python packages/paged-serve/benchmarks/bench_serving_client.py                 # all three backends
    uv run python packages/paged-serve/benchmarks/bench_serving_client.py --backend openai-chat --request-rate 8
    uv run python packages/paged-serve/benchmarks/bench_serving_client.py --base-url http://127.0.0.1:8000 \\
        --model my-model --backend vllm       # against a running ``paged-serve serve``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import workloads

log = logging.getLogger("bench_serving_client")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


@dataclass
class RequestOutput:
    """One request as benchmark_serving records it."""

    prompt_len: int
    success: bool = False
    generated_text: str = ""
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list = field(default_factory=list)  # the gaps between streamed chunks after the first
    error: str = ""


def request_body(backend: str, model: str, prompt: str, output_len: int) -> tuple[str, dict]:
    """The route and JSON body each backend sends: streamed, greedy, usage in the last chunk, EOS ignored."""
    common = {"model": model, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
              "ignore_eos": True}  # fmt: skip
    if backend in ("vllm", "openai"):
        return "/v1/completions", {**common, "prompt": prompt, "max_tokens": output_len}
    if backend == "openai-chat":
        messages = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", {**common, "messages": messages, "max_completion_tokens": output_len}
    raise ValueError(f"backend must be one of 'vllm', 'openai', 'openai-chat', got {backend!r}")


async def send(http, backend: str, model: str, prompt: str, prompt_len: int, output_len: int) -> RequestOutput:
    """Stream one request; time the first content chunk (TTFT) and the gaps after it (ITL)."""
    route, body = request_body(backend, model, prompt, output_len)
    out = RequestOutput(prompt_len=prompt_len)
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", route, json=body) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if chunk.get("usage"):
                    out.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                choice = chunk["choices"][0]
                text = choice["text"] if "text" in choice else choice["delta"].get("content") or ""
                if text:
                    now = time.perf_counter()
                    if not out.generated_text:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.generated_text += text
        out.latency = time.perf_counter() - start
        out.success = out.output_tokens > 0
        if not out.success:
            out.error = "the stream ended without a usage chunk counting output tokens"
    except Exception as e:  # noqa: BLE001 - a failed request is counted, as benchmark_serving counts it
        out.error = f"{type(e).__name__}: {e}"
    return out


async def benchmark(base_url: str, backend: str, model: str, prompts: list[tuple[str, int]], output_len: int,
                    request_rate: float = float("inf"), max_concurrency: int | None = None, seed: int = 0,
                    progress: bool = True) -> tuple[list[RequestOutput], float]:
    """Send every prompt (arrivals at ``request_rate`` per second, exponential gaps; ``inf``: all at once), at most
    ``max_concurrency`` in flight; the outputs in prompt order and the benchmark's duration in seconds."""
    import httpx
    from tqdm.auto import tqdm

    rng = random.Random(seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(prompts), desc=backend, disable=not progress)

    async def one(http, prompt, prompt_len):
        if limit is None:
            out = await send(http, backend, model, prompt, prompt_len, output_len)
        else:
            async with limit:
                out = await send(http, backend, model, prompt, prompt_len, output_len)
        bar.update(1)
        return out

    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0)) as http:
        start, tasks = time.perf_counter(), []
        for prompt, prompt_len in prompts:
            tasks.append(asyncio.create_task(one(http, prompt, prompt_len)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return list(outputs), duration


def metrics(outputs: list[RequestOutput], duration: float) -> dict:
    """benchmark_serving's table: counts, throughputs, and TTFT / TPOT / ITL / E2EL in ms (mean, median, p99)."""
    done = [o for o in outputs if o.success]
    ms = lambda xs, q: 1000 * (q(xs) if xs else 0.0)  # noqa: E731
    p99 = lambda xs: workloads.percentile(xs, 0.99)  # noqa: E731
    series = {"ttft": [o.ttft for o in done], "e2el": [o.latency for o in done],
              "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in done if o.output_tokens > 1],
              "itl": [gap for o in done for gap in o.itl]}  # fmt: skip
    out = {"completed": len(done), "failed": len(outputs) - len(done), "duration_s": duration,
           "total_input_tokens": sum(o.prompt_len for o in done),
           "total_output_tokens": sum(o.output_tokens for o in done)}  # fmt: skip
    out["request_throughput"] = len(done) / duration
    out["output_throughput"] = out["total_output_tokens"] / duration
    out["total_token_throughput"] = (out["total_input_tokens"] + out["total_output_tokens"]) / duration
    for name, xs in series.items():
        for stat, q in (("mean", statistics.mean), ("median", statistics.median), ("p99", p99)):
            out[f"{stat}_{name}_ms"] = ms(xs, q)
    return out


def random_prompts(n: int, input_len: int, vocab: int, seed: int = 0) -> list[tuple[str, int]]:
    """benchmark_serving's random dataset for the benchmark's word-level tokenizer: ``input_len`` random words."""
    rng = random.Random(seed)
    return [(" ".join(f"t{rng.randrange(2, vocab)}" for _ in range(input_len)), input_len) for _ in range(n)]


def main():
    doc = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--backend", choices=["vllm", "openai", "openai-chat", "all"], default="all")
    parser.add_argument("--base-url", default=None, help="a running server; default: start one on a tiny Llama")
    parser.add_argument("--model", default="bench", help="the served model name requests carry")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64, help="prompt length in tokens")
    parser.add_argument("--output-len", type=int, default=32, help="output tokens per request (EOS ignored)")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all")
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    backends = ["vllm", "openai", "openai-chat"] if args.backend == "all" else [args.backend]
    vocab = 8192
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
    rows = {}
    if args.base_url is None:
        from bench_serving import build_model
        from transformers import AutoTokenizer

        path = tempfile.mkdtemp(prefix="bench-llama-")
        build_model(path, vocab, max_pos=1024)
        tok = AutoTokenizer.from_pretrained(path)
        tok.chat_template = CHAT_TEMPLATE  # the chat backend needs one: plain concatenation
        tok.save_pretrained(path)
        for backend in backends:
            with workloads.LocalServer(path, args.num_prompts, num_gpu_blocks=1024) as server:
                outputs, duration = asyncio.run(benchmark(server.url, backend, "bench", prompts, args.output_len,
                                                          args.request_rate, args.max_concurrency, args.seed))
            rows[backend] = metrics(outputs, duration)
    else:
        for backend in backends:
            outputs, duration = asyncio.run(benchmark(args.base_url, backend, args.model, prompts, args.output_len,
                                                      args.request_rate, args.max_concurrency, args.seed))
            rows[backend] = metrics(outputs, duration)
    keys = list(next(iter(rows.values())))
    log.info("| metric | %s |", " | ".join(rows))
    log.info("|---|%s", "---|" * len(rows))
    for k in keys:
        log.info("| %s | %s |", k, " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k])
                                             for r in rows.values()))


if __name__ == "__main__":
    main()
