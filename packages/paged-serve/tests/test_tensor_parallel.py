"""Tensor parallelism at world size 2 (vLLM's ``tests/distributed/test_basic_distributed_correctness.py``: greedy
outputs of ``tensor_parallel_size=2`` equal to one rank's and to transformers'), on spawned gloo processes.

Each test checks that its mode happened (preemptions by swap broadcast to the worker, KV heads replicated, the
worker really died), and that no process outlives an engine.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist
from paged_serve import LLM, SamplingParams
from paged_serve.config import ParallelConfig
from paged_serve.distributed import get_tp_group

from .test_llm_engine import _prompts, hf_greedy

N_NEW = 16
# 2 layers x 16 tokens x head_size 16 x fp32, keys and values: 4,096 bytes per KV head per block
KV_BYTES = 12 * 4096


def _ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def _tokens(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def _no_workers_left(new_children):
    deadline = time.time() + 10
    while new_children() and time.time() < deadline:
        time.sleep(0.1)
    return not new_children() and get_tp_group().world_size == 1 and not dist.is_initialized()


def _engine_kw():
    # small enough that 8 prompts of up to 40 + 16 tokens preempt (by swap, which every rank must apply)
    return dict(kv_cache_memory_bytes=KV_BYTES, max_model_len=96, preemption_mode="swap", num_cpu_blocks=32)


def test_tp2_greedy_and_seeded_sampling_equal_one_rank_and_transformers(checkpoint, new_children):
    path, hf = checkpoint("llama")  # 4 query heads, 2 KV heads: one KV head per rank
    prompts = _prompts(hf.config.vocab_size, seed=3)
    want = hf_greedy(hf, prompts, n_new=N_NEW, eos_token_id=None)
    greedy = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=N_NEW) for i in range(len(prompts))]
    one = LLM(path, **_engine_kw())
    one_greedy, one_seeded = _ids(one.generate(_tokens(prompts), greedy)), _ids(one.generate(_tokens(prompts), seeded))
    one_blocks = one.llm_engine.cache_config.num_gpu_blocks
    one.llm_engine.shutdown()
    threads = torch.get_num_threads()
    tp = LLM(path, tensor_parallel_size=2, **_engine_kw())
    try:
        engine = tp.llm_engine
        assert len(new_children()) == 1  # the rank-1 worker
        assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // 2)  # the ranks share the cores
        assert _ids(tp.generate(_tokens(prompts), greedy)) == one_greedy == want
        assert engine.get_stats().num_preemptions_swap > 0  # swaps ran on both ranks' caches
        assert _ids(tp.generate(_tokens(prompts), seeded)) == one_seeded
        # each rank holds half the heads and of the vocabulary, and one of the two KV heads
        attn = engine.model.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
        assert attn.qkv_proj.weight.shape[0] == (2 + 2 * 1) * attn.head_dim
        assert engine.model.model.layers[0].mlp.down_proj.weight.shape[1] == hf.config.intermediate_size // 2
        assert engine.model.lm_head.weight.shape[0] * 2 >= hf.config.vocab_size
        # the same KV bytes per rank hold twice the blocks: half the KV heads each
        assert engine.cache_config.num_gpu_blocks == 2 * one_blocks == KV_BYTES // 4096
        assert engine.cache_engine.gpu_cache[0][0].shape[2] == 1
    finally:
        tp.llm_engine.shutdown()
    assert _no_workers_left(new_children) and torch.get_num_threads() == threads


def test_tp2_with_fewer_kv_heads_than_ranks_replicates_them(checkpoint, new_children):
    path, hf = checkpoint("llama", num_key_value_heads=1)  # MQA: the one KV head on both ranks (vLLM's rule)
    prompts = _prompts(hf.config.vocab_size, n=4, seed=5)
    want = hf_greedy(hf, prompts, n_new=N_NEW, eos_token_id=None)
    tp = LLM(path, tensor_parallel_size=2, num_gpu_blocks=64)
    try:
        attn = tp.llm_engine.model.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads, attn.qkv_proj.num_kv_head_replicas) == (2, 1, 2)
        assert _ids(tp.generate(_tokens(prompts), SamplingParams(temperature=0, max_tokens=N_NEW))) == want
    finally:
        tp.llm_engine.shutdown()
    assert _no_workers_left(new_children)


def test_sizes_that_do_not_divide_the_heads_fail_before_any_worker_starts(checkpoint, new_children):
    path, _ = checkpoint("llama")
    with pytest.raises(ValueError, match=r"attention heads \(4\) must be divisible by tensor parallel size \(3\)"):
        LLM(path, tensor_parallel_size=3)
    assert not new_children()
    with pytest.raises(ValueError, match=r"key/value heads \(3\) and tensor parallel size \(2\)"):
        ParallelConfig(2).verify_with_hf_config({"num_attention_heads": 6, "num_key_value_heads": 3})
    ParallelConfig(4).verify_with_hf_config({"num_attention_heads": 4, "num_key_value_heads": 2})  # replicated: ok
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
            LLM(path, tensor_parallel_size=bad)


def test_a_worker_that_dies_mid_generation_fails_the_engine_and_leaves_no_process(checkpoint, new_children):
    path, hf = checkpoint("llama")
    tp = LLM(path, tensor_parallel_size=2, num_gpu_blocks=64)
    (worker,) = new_children()
    killer = threading.Timer(1.0, os.kill, (worker.pid, signal.SIGKILL))
    start = time.time()
    killer.start()
    with pytest.raises(RuntimeError, match=rf"worker rank 1 \(pid {worker.pid}\) died with exit code -9"):
        tp.generate(_tokens(_prompts(hf.config.vocab_size, n=8)), SamplingParams(max_tokens=200, ignore_eos=True),
                    use_tqdm=False)  # fmt: skip
    assert time.time() - start < 60
    with pytest.raises(RuntimeError, match="died"):  # the engine stays failed
        tp.generate(_tokens([[5, 6, 7]]), SamplingParams(max_tokens=2), use_tqdm=False)
    tp.llm_engine.shutdown()
    assert _no_workers_left(new_children)


def test_tp2_loads_only_its_slice_of_each_tensor(checkpoint):
    """The weight loaders read lazy safetensors slices: a rank's bytes read are its share, not the checkpoint."""
    from paged_serve.distributed.parallel_state import GroupCoordinator, use_tp_group
    from paged_serve.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
    from safetensors import safe_open

    path, hf = checkpoint("llama")
    sd = hf.state_dict()
    with safe_open(f"{path}/model.safetensors", framework="pt") as f, use_tp_group(GroupCoordinator(1, 2)):
        qkv = QKVParallelLinear(64, 16, 4, 2, bias=False)
        for shard in "qkv":
            qkv.weight_loader(qkv.weight, f.get_slice(f"model.layers.0.self_attn.{shard}_proj.weight"), shard)
        o = RowParallelLinear(64, 64, bias=False)
        o.weight_loader(o.weight, f.get_slice("model.layers.0.self_attn.o_proj.weight"))
    q, k, v = (sd[f"model.layers.0.self_attn.{s}_proj.weight"] for s in "qkv")
    torch.testing.assert_close(qkv.weight, torch.cat([q[32:], k[16:], v[16:]]), rtol=0, atol=0)
    torch.testing.assert_close(o.weight, sd["model.layers.0.self_attn.o_proj.weight"][:, 32:], rtol=0, atol=0)


def _children(pid: int) -> list[int]:
    """Pids of ``pid``'s child processes that run a multiprocessing spawn (the workers, not the resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmdline = open(f"/proc/{entry}/cmdline").read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            found.append(int(entry))
    return found


def test_server_answers_500_when_a_worker_dies_then_exits_leaving_no_process(checkpoint):
    import asyncio

    import httpx

    from .server_util import start_server

    path, _ = checkpoint("llama")
    args = [path, "--tensor-parallel-size", "2", "--num-gpu-blocks", "64", "--max-model-len", "256",
            "--log-level", "warning"]  # fmt: skip
    proc, url = start_server(args, timeout=120)
    try:
        (worker,) = _children(proc.pid)

        async def load():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                body = {"prompt": "the", "max_tokens": 250, "ignore_eos": True}
                tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(2)]
                await asyncio.sleep(1.0)
                os.kill(worker, signal.SIGKILL)
                return await asyncio.gather(*tasks)

        t0 = time.perf_counter()
        responses = asyncio.run(load())
        rc = proc.wait(timeout=30)  # the server stops by itself: no hang
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r.status_code for r in responses] == [500, 500]
    assert all("worker rank 1" in r.json()["error"]["message"] for r in responses)
    assert rc == 1 and "the engine failed" in stderr, stderr[-2000:]
    assert time.perf_counter() - t0 < 40
    assert not os.path.exists(f"/proc/{worker}") or "zombie" in open(f"/proc/{worker}/status").read().lower()
    assert not _children(proc.pid)


def test_a_step_that_fails_on_the_driver_fails_the_engine_for_good(checkpoint, new_children, monkeypatch):
    """The worker ran the step the driver broadcast and waits in its collectives: the ranks are out of step, so
    the engine refuses further steps (instead of mismatching collectives) and shutdown still ends the worker."""
    path, _ = checkpoint("llama")
    tp = LLM(path, tensor_parallel_size=2, num_gpu_blocks=64)
    driver = tp.llm_engine.model_executor.driver_worker

    def broken(request):
        raise ValueError("planted failure on the driver")

    monkeypatch.setattr(driver, "execute_model", broken)
    with pytest.raises(ValueError, match="planted"):
        tp.generate(_tokens([[5, 6, 7]]), SamplingParams(max_tokens=2), use_tqdm=False)
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="must be rebuilt"):
        tp.generate(_tokens([[5, 6, 7]]), SamplingParams(max_tokens=2), use_tqdm=False)
    tp.llm_engine.shutdown()
    assert _no_workers_left(new_children)
