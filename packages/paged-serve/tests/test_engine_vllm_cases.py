"""Engine and ``LLM`` cases from vLLM's own tests, rewritten for paged_serve: prompt forms (``tests/test_inputs.py``,
``tests/entrypoints/llm/test_generate.py``), requests that can never fit (``tests/core/test_scheduler.py``),
``num_cached_tokens`` (``tests/prefix_caching``), the length cap (``tests/test_sequence.py``-style), incremental
detokenisation (``tests/detokenizer/test_detokenize.py``), ``skip_tokenizer_init``
(``tests/engine/test_skip_tokenizer_init.py``), ``logit_bias`` and the sampling-parameter checks
(``tests/test_sampling_params.py``)."""

from __future__ import annotations

import pytest
import torch
from paged_serve import LLM, EngineArgs, SamplingParams
from paged_serve.core import Sequence, SequenceGroup, SequenceStatus
from paged_serve.engine.output_processor import RequestState
from paged_serve.inputs import TextPrompt, TokensPrompt

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(checkpoint):
    path, hf = checkpoint("llama")
    engine = LLM(path, num_gpu_blocks=64, max_num_seqs=8)
    engine.hf = hf
    return engine


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_generate_takes_every_vllm_prompt_form(llm):
    tok = llm.get_tokenizer()
    text = "the quick brown fox"
    ids = tok.encode(text)
    want = _tokens(llm.generate(prompt_token_ids=[ids], sampling_params=GREEDY, use_tqdm=False))
    assert _tokens(llm.generate(TokensPrompt(prompt_token_ids=ids), GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate(TextPrompt(prompt=text), GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate(text, GREEDY, use_tqdm=False)) == want
    mixed = llm.generate([text, {"prompt": text}, {"prompt_token_ids": ids}], GREEDY, use_tqdm=False)
    assert _tokens(mixed) == want * 3
    assert mixed[1].prompt == text and mixed[2].prompt is None and mixed[2].prompt_token_ids == ids
    many = llm.generate([{"prompt_token_ids": ids}, {"prompt_token_ids": ids[:3]}], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in many] == [ids, ids[:3]]
    for bad in (42, {"text": text}, [text, 3.5]):
        with pytest.raises(TypeError, match="PromptType|TextPrompt|TokensPrompt"):
            llm.generate(bad, GREEDY, use_tqdm=False)


def test_requests_that_can_never_fit_are_refused_up_front(llm, checkpoint):
    with pytest.raises(ValueError, match="max_num_seqs=8"):
        llm.generate("the", SamplingParams(n=9, temperature=1.0), use_tqdm=False)
    with pytest.raises(ValueError, match="max_num_seqs=8"):
        llm.generate("the", SamplingParams(n=2, best_of=9, temperature=1.0), use_tqdm=False)
    # a group whose sequences outgrow the pool together is vLLM's to accept: test_group_kv_pressure.py


def test_parallel_sampling_under_kv_pressure_never_cuts_a_choice(checkpoint):
    """vLLM v1: every choice reaches its max_tokens; the pool preempts and resumes, it never shortens silently."""
    path, _ = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=12, max_model_len=192, seed=3)
    params = [SamplingParams(n=3, temperature=1.0, max_tokens=40, ignore_eos=True, seed=i) for i in range(4)]
    outs = llm.generate([[5 + i] * 10 for i in range(4)], params, use_tqdm=False)
    stats = llm.get_stats()
    assert stats.num_preemptions_recompute + stats.num_preemptions_swap > 0  # the pool really ran out
    assert all(len(c.token_ids) == 40 and c.finish_reason == "length" for o in outs for c in o.outputs)
    assert all(len(o.outputs) == 3 for o in outs)


def test_num_cached_tokens_counts_prefix_cache_hits(checkpoint):
    path, _ = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64, enable_prefix_caching=True)
    prefix = list(range(10, 42))  # two full blocks
    first = llm.generate([prefix + [50, 51]], GREEDY, use_tqdm=False)[0]
    second = llm.generate([prefix + [60]], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 32


def test_the_length_cap_counts_as_vllm_and_transformers(checkpoint):
    """A 10-token prompt in a 32-token context gets 23 tokens: the last sampled token needs no KV slot."""
    path, hf = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64, max_model_len=32)
    prompt = list(range(20, 30))
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False)
    tokens = out[0].outputs[0].token_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_length=33, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert len(tokens) == 23 and tokens == ref[0, 10:].tolist()
    assert out[0].outputs[0].finish_reason == "length"


def test_skip_tokenizer_init_takes_token_ids_and_returns_no_text(checkpoint):
    path, _ = checkpoint("llama")
    plain = LLM(path, num_gpu_blocks=32)
    bare = LLM(path, num_gpu_blocks=32, skip_tokenizer_init=True)
    assert bare.get_tokenizer() is None
    ids = [7, 8, 9, 10]
    out = bare.generate(TokensPrompt(prompt_token_ids=ids), GREEDY, use_tqdm=False)[0].outputs[0]
    assert out.text == "" and out.token_ids == _tokens(plain.generate([ids], GREEDY, use_tqdm=False))[0]
    with pytest.raises(ValueError, match="prompts must be None if skip_tokenizer_init is True"):  # vLLM's words
        bare.generate("the quick", GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        bare.generate([ids], SamplingParams(stop=["x"]), use_tqdm=False)


def test_engine_args_vllm_users_pass(checkpoint):
    path, _ = checkpoint("llama")
    args = EngineArgs(path, scheduler_delay_factor=0.25, skip_tokenizer_init=True)
    assert args.create_scheduler_config(256).delay_factor == 0.25
    with pytest.raises(ValueError, match="scheduler_delay_factor"):
        EngineArgs(path, scheduler_delay_factor=-1)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(stop_token_ids=["x"]), "stop_token_ids"),
        (dict(stop_token_ids=[1.5]), "stop_token_ids"),
        (dict(seed=2**63), "seed"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(n=2, temperature=0), "n must be 1"),
        (dict(logit_bias={"a": 1.0}), "logit_bias"),
        (dict(logit_bias={3: "x"}), "logit_bias"),
    ],
)
def test_bad_sampling_values_raise_value_errors_naming_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_logit_bias_steers_sampling_and_is_range_checked(llm):
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                   logit_bias={42: 100.0}), use_tqdm=False)  # fmt: skip
    assert out[0].outputs[0].token_ids == [42] * 5
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate([[5]], SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)


def test_a_stop_token_leaves_no_dangling_partial_character(llm):
    """The text stops before the stop token; an incomplete UTF-8 sequence in front of it is held back, as vLLM's
    incremental detokenizer never emits a partial character."""
    engine = llm.llm_engine
    tok = engine.tokenizer
    first_byte, second_byte = tok.encode("é", add_special_tokens=False)  # two byte tokens in this BPE
    assert tok.decode([first_byte]) == "\ufffd"
    for stop_id, params in (
        (1, SamplingParams()),  # EOS
        (second_byte, SamplingParams(stop_token_ids=[second_byte])),  # a stop token that completes the character
    ):
        params.update_from_generation_config({1})
        seq = Sequence(0, [5, 6], 16)
        group = SequenceGroup("r", [seq], sampling_params=params)
        state = RequestState(group, params, None, index={0: 0})
        for t in tok.encode("ab", add_special_tokens=False) + [first_byte, stop_id]:
            seq.append_token_id(t)
        seq.status = SequenceStatus.FINISHED_STOPPED
        seq.stop_reason = stop_id if stop_id != 1 else None
        text = engine.output_processor.make_output(state).outputs[0].text
        assert text == "ab", (stop_id, text)


def test_a_stop_token_s_text_is_left_out_unless_asked(llm):
    base = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    tokens = base[0].outputs[0].token_ids
    k = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])  # its first appearance
    stop = tokens[k]
    tok = llm.get_tokenizer()
    cut = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]),
                       use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert cut.token_ids == tokens[: k + 1] and cut.stop_reason == stop
    assert cut.text == tok.decode(tokens[:k]).rstrip("\ufffd")  # no partial character left in front of it
    keep = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], include_stop_str_in_output=True)
    kept = llm.generate([[5, 6, 7]], keep, use_tqdm=False)[0].outputs[0]
    assert kept.text == tok.decode(tokens[: k + 1])


@pytest.mark.parametrize("engine_kw", [dict(), dict(enable_chunked_prefill=True, max_num_batched_tokens=8)])
def test_prompt_logprobs_match_transformers(checkpoint, engine_kw):
    """vLLM's tests/samplers/test_logprobs.py: prompt_logprobs[i] is token i's logprob given tokens < i (None first),
    equal to transformers' forward pass; in chunks too."""
    path, hf = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64, max_num_seqs=4, **engine_kw)
    prompt = list(range(30, 50))
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3), use_tqdm=False)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    lps = out.prompt_logprobs
    assert len(lps) == len(prompt) and lps[0] is None
    for i in range(1, len(prompt)):
        assert abs(lps[i][prompt[i]].logprob - ref[i - 1, prompt[i]].item()) < 1e-4
        top = ref[i - 1].topk(3).indices.tolist()
        assert set(top) <= set(lps[i]) and lps[i][top[0]].rank == 1
    with pytest.raises(ValueError, match="prompt_logprobs"):
        LLM(path, num_gpu_blocks=16, enable_prefix_caching=True).generate(
            [prompt], SamplingParams(prompt_logprobs=1), use_tqdm=False
        )


def test_token_ids_of_any_integer_type_are_accepted(llm):
    """numpy / torch integers (what users get from a tokenizer's tensors) work as vLLM's int lists do."""
    import numpy as np

    ids = [5, 6, 7]
    want = _tokens(llm.generate(prompt_token_ids=[ids], sampling_params=GREEDY, use_tqdm=False))
    assert _tokens(llm.generate(prompt_token_ids=[np.array(ids)], sampling_params=GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate({"prompt_token_ids": torch.tensor(ids).tolist()}, GREEDY, use_tqdm=False)) == want
    assert _tokens(llm.generate([list(np.array(ids, dtype=np.int64))], GREEDY, use_tqdm=False)) == want
    with pytest.raises(TypeError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [5, True]}, GREEDY, use_tqdm=False)
