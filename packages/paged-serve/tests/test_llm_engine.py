"""End to end against transformers: ``LLM.generate`` vs ``generate`` on tiny random checkpoints saved by transformers.

Mirrors vLLM's tests/basic_correctness (greedy outputs equal to HF's, with and without preemption and chunked
prefill) and tests/prefix_caching. Each mode asserts it really happened (preemptions counted, cache hits, chunks),
so none can pass vacuously.
"""

from __future__ import annotations

import pytest
import torch
from paged_serve import LLM, SamplingParams

N_NEW = 20


def _prompts(vocab, n=8, seed=1, shared_prefix=None):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (n,), generator=gen).tolist()
    prompts = [torch.randint(2, vocab, (k,), generator=gen).tolist() for k in lengths]
    if shared_prefix:
        prefix = torch.randint(2, vocab, (shared_prefix,), generator=gen).tolist()
        prompts = [prefix + p for p in prompts]
    return prompts


def hf_greedy(model, prompts, n_new=N_NEW, **kw):
    outs = []
    for p in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False, pad_token_id=0, **kw)
        outs.append(out[0, len(p) :].tolist())
    return outs


MODES = {
    "plain": dict(num_gpu_blocks=64),
    "recompute": dict(num_gpu_blocks=12, max_model_len=96, preemption_mode="recompute"),
    "swap": dict(num_gpu_blocks=12, max_model_len=96, preemption_mode="swap", num_cpu_blocks=32),
    "chunked": dict(num_gpu_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=4),
    "prefix": dict(num_gpu_blocks=64, enable_prefix_caching=True),
}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_matches_transformers(checkpoint, arch, mode):
    path, hf = checkpoint(arch)
    prompts = _prompts(hf.config.vocab_size, shared_prefix=24 if mode == "prefix" else None)
    want = hf_greedy(hf, prompts, eos_token_id=None)
    llm = LLM(path, block_size=8, **{"num_cpu_blocks": 0, **MODES[mode]})
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    if mode == "prefix":  # one request first, so the others find its prefix cached
        llm.generate(prompt_token_ids=prompts[:1], sampling_params=params, use_tqdm=False)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    stats = llm.get_stats()
    if mode == "recompute":
        assert stats.num_preemptions_recompute > 0 and stats.num_preemptions_swap == 0
    if mode == "swap":
        assert stats.num_preemptions_swap > 0
    if mode == "prefix":
        assert stats.prefix_cache_hit_rate > 0.3
    if mode == "chunked":
        assert stats.num_steps > len(prompts) + N_NEW  # prompts of up to 39 tokens went in 16-token chunks
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True),  # MQA with biases
        dict(num_key_value_heads=4, tie_word_embeddings=True),  # MHA, tied head
        dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 500000.0,
            }
        ),
    ],
    ids=["mqa-bias", "mha-tied", "rope-linear", "rope-llama3"],
)
def test_llama_variants_match_transformers(checkpoint, overrides):
    path, hf = checkpoint("llama", **overrides)
    prompts = _prompts(hf.config.vocab_size, n=3)
    want = hf_greedy(hf, prompts, n_new=12, eos_token_id=None)
    llm = LLM(path, block_size=16, num_gpu_blocks=32)
    outs = llm.generate(
        prompt_token_ids=prompts,
        sampling_params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in outs] == want


def test_sharded_checkpoint_and_text_prompts(checkpoint_builder, tmp_path):
    hf = checkpoint_builder(tmp_path, "llama", seed=3, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    llm = LLM(str(tmp_path), num_gpu_blocks=32)
    tok = llm.get_tokenizer()
    text = "the quick brown fox"
    ids = tok.encode(text)
    want = hf_greedy(hf, [ids], n_new=10, eos_token_id=None)[0]
    out = llm.generate(text, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt_token_ids == ids and out.outputs[0].token_ids == want
    assert out.outputs[0].text == tok.decode(want)


def test_eos_stops_and_is_reported(checkpoint):
    path, hf = checkpoint("gpt2")
    prompts = _prompts(hf.config.vocab_size, n=4)
    greedy = hf_greedy(hf, prompts, eos_token_id=None)
    eos = max(set(sum(greedy, [])), key=sum(greedy, []).count)  # a token greedy decoding really emits
    want = hf_greedy(hf, prompts, eos_token_id=[1, eos])
    llm = LLM(path, num_gpu_blocks=64)
    outs = llm.generate(
        prompt_token_ids=prompts,
        sampling_params=SamplingParams(temperature=0, max_tokens=N_NEW, stop_token_ids=[eos]),
        use_tqdm=False,
    )
    for out, expect in zip(outs, want):
        expect = expect[: expect.index(eos) + 1] if eos in expect else expect
        assert out.outputs[0].token_ids == expect
        if expect[-1] == eos:
            assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == eos
    assert any(o.outputs[0].finish_reason == "stop" for o in outs)


def test_repetition_penalty_and_logprobs_match_transformers(checkpoint):
    path, hf = checkpoint("llama")
    prompts = _prompts(hf.config.vocab_size, n=3)
    want = hf_greedy(hf, prompts, eos_token_id=None, repetition_penalty=1.3)
    llm = LLM(path, num_gpu_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True, repetition_penalty=1.3, logprobs=3)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    # logprobs: the model's own log-softmax at each step (transformers' logits on the full sequence)
    out = outs[0].outputs[0]
    full = torch.tensor([prompts[0] + out.token_ids])
    with torch.no_grad():
        ref = hf(full).logits[0, len(prompts[0]) - 1 : -1].log_softmax(-1)
    for step, (token, lps) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(lps[token].logprob - float(ref[step, token])) < 1e-4
        top = ref[step].topk(3).indices.tolist()
        assert set(top) <= set(lps) and lps[top[0]].rank == 1
    assert abs(out.cumulative_logprob - sum(lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs))) < 1e-4


@pytest.mark.gpu(1)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_on_cuda_matches_transformers(checkpoint, arch):
    """The compiled Triton kernels inside the engine, against transformers on the same GPU (fp32)."""
    path, hf = checkpoint(arch)
    hf = hf.to("cuda")
    prompts = _prompts(hf.config.vocab_size)
    want = []
    for p in prompts:
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([p], device="cuda"),
                max_new_tokens=N_NEW,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        want.append(out[0, len(p) :].tolist())
    hf.to("cpu")
    llm = LLM(path, device="cuda", block_size=16, num_gpu_blocks=64, num_cpu_blocks=16, max_model_len=128)
    outs = llm.generate(
        prompt_token_ids=prompts,
        sampling_params=SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in outs] == want
