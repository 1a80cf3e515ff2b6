"""Several ``LLM`` s in one process (vLLM's ``prefix_caching.py`` pattern): ``del llm`` and
``paged_serve.distributed.cleanup_dist_env_and_memory()`` (vLLM ``distributed/parallel_state.py``) free the model,
the KV cache, the worker processes and the process group; ``LLMEngine.shutdown`` frees them while the object lives."""

from __future__ import annotations

import gc
import logging
import weakref

import torch.distributed as dist
from paged_serve import LLM, SamplingParams
from paged_serve.distributed import cleanup_dist_env_and_memory

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_cleanup_is_importable_where_vllm_has_it():
    """vLLM defines it in ``vllm/distributed/parallel_state.py`` and re-exports it from ``vllm.distributed``;
    examples import it from either path."""
    import inspect

    import paged_serve.distributed
    from paged_serve.distributed.parallel_state import cleanup_dist_env_and_memory as from_parallel_state

    assert from_parallel_state is paged_serve.distributed.cleanup_dist_env_and_memory is cleanup_dist_env_and_memory
    assert "cleanup_dist_env_and_memory" in paged_serve.distributed.__all__
    assert str(inspect.signature(from_parallel_state)) == "(shutdown_ray: 'bool' = False) -> 'None'"


def _held(llm) -> list[weakref.ref]:
    """Weak references to what an engine holds: the model, a weight, every KV cache tensor."""
    engine = llm.llm_engine
    refs = [weakref.ref(engine.model), weakref.ref(next(engine.model.parameters()))]
    refs += [weakref.ref(t) for layer in engine.cache_engine.gpu_cache for t in layer]
    return refs


def test_del_and_cleanup_free_the_first_llm_before_the_second_is_built(checkpoint):
    path, _ = checkpoint("llama")
    first = LLM(path, num_gpu_blocks=64)
    want = first.generate(["the quick brown fox"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    refs = _held(first)
    first.llm_engine.self_ref = first.llm_engine  # a reference cycle: only the collector frees it
    del first
    assert any(r() is not None for r in refs)  # the cycle keeps it until something collects
    cleanup_dist_env_and_memory()
    assert all(r() is None for r in refs)
    for _ in range(3):  # building engine after engine leaks nothing
        llm = LLM(path, num_gpu_blocks=64, enable_prefix_caching=True)
        assert llm.generate(["the quick brown fox"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
        refs = _held(llm)
        del llm
        cleanup_dist_env_and_memory()
        assert all(r() is None for r in refs)


def test_engine_shutdown_frees_the_model_and_kv_cache_while_the_llm_lives(checkpoint):
    path, _ = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64)
    refs = _held(llm)
    llm.llm_engine.add_request("r", "the quick", GREEDY)
    llm.llm_engine.shutdown()
    gc.collect()
    assert all(r() is None for r in refs)
    assert not llm.llm_engine.has_unfinished_requests()
    llm.llm_engine.shutdown()  # idempotent


def test_cleanup_after_a_tensor_parallel_llm_leaves_no_worker_and_no_process_group(checkpoint, caplog, new_children):
    path, _ = checkpoint("llama")
    tp = LLM(path, num_gpu_blocks=64, tensor_parallel_size=2)
    want = tp.generate(["the quick brown fox"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert new_children() and dist.is_initialized()
    del tp
    with caplog.at_level(logging.INFO, logger="paged_serve.distributed.parallel_state"):
        cleanup_dist_env_and_memory(shutdown_ray=True)
    assert new_children() == [] and not dist.is_initialized()
    assert "runs no Ray" in caplog.text
    single = LLM(path, num_gpu_blocks=64)
    assert single.generate(["the quick brown fox"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
