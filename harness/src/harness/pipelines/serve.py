"""The serving half of ``train-then-serve``: paged-serve on the trained checkpoint, offline or as a server."""

from __future__ import annotations

PROMPTS = [
    "import os\nimport sys\n",
    "def main():\n    ",
    "class Config:\n    def __init__(self",
    "    for i in range(",
    '"""Utilities for working with paths.\n\nThis module provides',
    '"""Utilities for working with paths.\n\nThis module defines',
]


def generate(
    checkpoint: str, device: str, max_tokens: int = 40, tensor_parallel_size: int = 1
) -> tuple[list, dict, float]:
    """Greedy continuations of the prompts in one continuous batch, stepping the engine as ``LLM.generate`` does
    (with a tqdm bar) while sampling its KV statistics each step, on ``tensor_parallel_size`` ranks; returns
    (outputs, statistics, seconds)."""
    import time

    from paged_serve import LLM, RequestOutputKind, SamplingParams
    from tqdm.auto import tqdm

    llm = LLM(
        checkpoint,
        device=device,
        block_size=16,
        enable_prefix_caching=True,
        max_num_seqs=16,
        kv_cache_memory_bytes=64 << 20,
        swap_space=0.0625,
        tensor_parallel_size=tensor_parallel_size,
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, repetition_penalty=1.2)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    start = time.perf_counter()
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt=prompt, params=params)
    done, util, usage = {}, [], []
    with tqdm(total=len(PROMPTS), desc="serve (paged-serve)", unit="req") as bar:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
            stats = engine.get_stats()
            if stats.num_running:
                util.append(stats.kv_utilization)
                usage.append(stats.gpu_cache_usage)
    seconds = time.perf_counter() - start
    stats = engine.get_stats().as_dict()
    stats["kv_utilization"] = sum(util) / len(util) if util else 0.0
    stats["peak_cache_usage"] = max(usage, default=0.0)
    engine.shutdown()  # its worker processes too
    return [done[str(i)] for i in range(len(PROMPTS))], stats, seconds


def serve(checkpoint: str, device: str, host: str, port: int, tensor_parallel_size: int = 1) -> None:
    """The OpenAI-compatible server on the checkpoint (until Ctrl-C)."""
    from paged_serve.entrypoints.cli import main as paged_serve_main

    print(
        f"serving {checkpoint} on http://{host}:{port}; try:\n"
        f"  curl http://{host}:{port}/v1/completions -H 'content-type: application/json' "
        '-d \'{"prompt": "def main():", "max_tokens": 32, "temperature": 0}\'',
        flush=True,
    )
    paged_serve_main(
        [
            "serve",
            checkpoint,
            "--host",
            host,
            "--port",
            str(port),
            "--device",
            device,
            "--served-model-name",
            "train-then-serve",
            "--tensor-parallel-size",
            str(tensor_parallel_size),
        ]
    )
