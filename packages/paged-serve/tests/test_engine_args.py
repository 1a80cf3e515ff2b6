"""Bad arguments fail at construction with an error naming the value (vLLM's tests/engine/test_arg_utils.py and
tests/test_sampling_params.py in spirit); statistics and dtype handling of a running engine."""

from __future__ import annotations

import pytest
import torch
from paged_serve import LLM, EngineArgs, SamplingParams


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n=0), "n must be"),
        (dict(n=3, best_of=2), "best_of must be"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(logprobs=-1), "logprobs"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(n=2, temperature=0.0), "greedy"),
        (dict(use_beam_search=True, best_of=1), "beam width"),
        (dict(use_beam_search=True, best_of=2, temperature=0.7), "temperature must be 0"),
        (dict(use_beam_search=True, best_of=2, temperature=0, early_stopping="sometimes"), "early_stopping"),
        (dict(use_beam_search=True, best_of=2, temperature=0, stop=["x"]), "stop strings"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_like_vllm():
    p = SamplingParams(stop="x", top_k=0, temperature=0.0, top_p=0.5)
    assert p.stop == ["x"] and p.top_k == -1 and p.top_p == 1.0  # greedy resets the filters
    assert SamplingParams(n=3).best_of == 3
    with pytest.raises(TypeError):
        SamplingParams(nucleus=0.9)  # an unknown field is an error, never ignored


def test_engine_args_fail_before_loading_anything(checkpoint, tmp_path):
    path, _ = checkpoint("llama")
    with pytest.raises(ValueError, match="not a directory"):
        EngineArgs(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="block_size 12"):
        EngineArgs(path, block_size=12)
    with pytest.raises(ValueError, match="disagree"):
        EngineArgs(path, num_gpu_blocks=8, num_gpu_blocks_override=9)
    with pytest.raises(ValueError, match="preemption_mode"):
        EngineArgs(path, preemption_mode="evict")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineArgs(path, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="device"):
        EngineArgs(path, device="tpu")
    with pytest.raises(TypeError, match="unknown engine argument.*tensor_parallel_sizes"):
        LLM(path, tensor_parallel_sizes=2)
    with pytest.raises(ValueError, match=r"attention heads \(4\) must be divisible by tensor parallel size \(3\)"):
        LLM(path, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="max_model_len=4096 exceeds"):
        LLM(path, max_model_len=4096)
    with pytest.raises(ValueError, match="larger than the KV cache holds"):
        LLM(path, num_gpu_blocks=2, max_model_len=64)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(path, max_num_batched_tokens=32, max_model_len=64)
    with pytest.raises(ValueError, match="dtype 'int8'"):
        LLM(path, dtype="int8", num_gpu_blocks=32)


def test_add_request_checks(checkpoint):
    path, hf = checkpoint("llama")
    engine = LLM(path, num_gpu_blocks=32).llm_engine
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("a", prompt_token_ids=[1, hf.config.vocab_size])
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("a", prompt_token_ids=[])
    with pytest.raises(ValueError, match="exactly one"):
        engine.add_request("a")
    with pytest.raises(ValueError, match="max_logprobs"):
        engine.add_request("a", prompt_token_ids=[5], params=SamplingParams(logprobs=50))
    engine.add_request("a", prompt_token_ids=[5])
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", prompt_token_ids=[6])


def test_stats_and_a_bf16_engine(checkpoint):
    path, hf = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=32, dtype="bfloat16", enable_prefix_caching=True)
    model = llm.llm_engine.model
    rope = model.model.layers[0].self_attn.rotary_emb
    assert model.lm_head.weight.dtype == torch.bfloat16 and rope.cos_cache.dtype == torch.float32
    assert llm.llm_engine.cache_engine.gpu_cache[0][0].dtype == torch.bfloat16
    engine = llm.llm_engine
    engine.add_request("a", prompt_token_ids=list(range(2, 40)), params=SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    stats = llm.get_stats()
    assert stats.num_running == 1 and 0 < stats.gpu_cache_usage < 1 and stats.kv_utilization > 0.5
    while engine.has_unfinished_requests():
        engine.step()
    stats = llm.get_stats()
    assert stats.num_requests_finished == 1 and stats.generation_tokens_total == 8
    assert stats.prompt_tokens_total == 38 and stats.prefix_cache_hit_rate == 0.0
