"""Sampling through the engine: seeded reproducibility, parallel sampling by fork + copy-on-write, stop rules,
penalties, and beam search token-identical to transformers (mirrors vLLM's tests/samplers/test_seeded_generate.py,
test_beam_search.py, test_stop_reason / test_min_tokens and the sampler unit tests)."""

from __future__ import annotations

import pytest
import torch
from paged_serve import LLM, SamplingParams
from paged_serve.core import SequenceStatus
from paged_serve.model_executor.layers.sampler import Sampler, SampleRow

from .conftest import build_checkpoint


def _prompts(vocab, n, seed=5, lo=3, hi=30):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(2, vocab, (int(k),), generator=gen).tolist() for k in torch.randint(lo, hi, (n,), generator=gen)
    ]


def test_seeded_sampling_is_reproducible_whatever_the_batch(checkpoint):
    path, hf = checkpoint("llama")
    prompts = _prompts(hf.config.vocab_size, 6)
    llm = LLM(path, num_gpu_blocks=64)
    seeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)  # unseeded neighbours
    alone = llm.generate(prompt_token_ids=prompts[:1], sampling_params=seeded, use_tqdm=False)[0]
    crowd = llm.generate(prompt_token_ids=prompts, sampling_params=[seeded] + [other] * 5, use_tqdm=False)
    again = llm.generate(
        prompt_token_ids=prompts[3:] + prompts[:1], sampling_params=[other] * 3 + [seeded], use_tqdm=False
    )
    assert alone.outputs[0].token_ids == crowd[0].outputs[0].token_ids == again[-1].outputs[0].token_ids
    reseeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=99, max_tokens=16, ignore_eos=True)
    different = llm.generate(prompt_token_ids=prompts[:1], sampling_params=reseeded, use_tqdm=False)[0]
    assert different.outputs[0].token_ids != alone.outputs[0].token_ids  # the seed matters


def test_parallel_sampling_forks_the_prompt_blocks(checkpoint):
    path, hf = checkpoint("llama")
    llm = LLM(path, block_size=8, num_gpu_blocks=64)
    engine = llm.llm_engine
    prompt = _prompts(hf.config.vocab_size, 1, lo=20, hi=21)[0]  # 20 tokens: 2 full blocks + a partial one
    engine.add_request(
        "r", prompt_token_ids=prompt, params=SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    )
    engine.step()  # prefill + first sample: the parent is forked into 3 sequences
    group = engine.requests["r"].group
    tables = [engine.scheduler.block_manager.get_block_table(s) for s in group.get_seqs()]
    assert len(tables) == 3 and all(t == tables[0] for t in tables)  # every block shared, ref count 3
    assert engine.scheduler.block_manager.get_num_free_gpu_blocks() == 64 - 3
    engine.step()  # each writes its 21st token into the shared partial block: two copies, the last owns it
    tables = [engine.scheduler.block_manager.get_block_table(s) for s in group.get_seqs()]
    assert all(t[:2] == tables[0][:2] for t in tables) and len({t[2] for t in tables}) == 3
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    final = outputs[-1]
    assert final.finished and len(final.outputs) == 3 and [o.index for o in final.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in final.outputs}) > 1


def test_best_of_returns_the_n_most_likely(checkpoint):
    path, hf = checkpoint("gpt2")
    llm = LLM(path, num_gpu_blocks=64)
    params = SamplingParams(n=2, best_of=4, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    out = llm.generate(prompt_token_ids=_prompts(hf.config.vocab_size, 1), sampling_params=params, use_tqdm=False)[0]
    assert len(out.outputs) == 2
    assert out.outputs[0].cumulative_logprob >= out.outputs[1].cumulative_logprob


def test_stop_strings_min_tokens_and_max_tokens(checkpoint):
    path, hf = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64)
    tok = llm.get_tokenizer()
    prompt = _prompts(hf.config.vocab_size, 1)[0]
    base = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        use_tqdm=False,
    )
    text = base[0].outputs[0].text
    assert text == tok.decode(base[0].outputs[0].token_ids)
    stop = text[8:11]
    cut = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop and cut.text == text[: text.index(stop)]
    kept = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(
            temperature=0, max_tokens=30, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]
    first = base[0].outputs[0].token_ids[0]
    held = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=5, min_tokens=3, stop_token_ids=[first]),
        use_tqdm=False,
    )[0].outputs[0]
    assert held.token_ids[0] != first and len(held.token_ids) >= 3  # the stop token was masked for 3 tokens
    capped = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        use_tqdm=False,
    )
    assert capped[0].outputs[0].finish_reason == "length" and len(capped[0].outputs[0].token_ids) == 4


def test_sampler_filters_and_penalties():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    sampler = Sampler(gen)

    def draw(params, outputs=(), n=200):
        row = SampleRow(params, [], list(outputs), None, n)
        return set(sampler(logits, [row])[0].token_ids)

    assert draw(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draw(SamplingParams(temperature=1.0, top_p=0.5)) == {0}  # p(0) = 0.64 covers top_p alone
    assert draw(SamplingParams(temperature=1.0, min_p=0.3)) == {0, 1}  # p(1)/p(0) = 0.37, p(2)/p(0) = 0.14
    assert draw(SamplingParams(temperature=0.0), n=1) == {0}
    assert draw(SamplingParams(temperature=0.0, presence_penalty=2.0), outputs=[0], n=1) == {1}  # 3 - 2 < 2
    assert draw(SamplingParams(temperature=0.0, frequency_penalty=0.6), outputs=[0, 0], n=1) == {1}
    assert draw(SamplingParams(temperature=0.0, repetition_penalty=2.0), outputs=[0], n=1) == {1}  # 3 / 2 < 2


@pytest.fixture(scope="module")
def eos_prone_gpt2(tmp_path_factory):
    """A tiny GPT-2 whose final LayerNorm bias leans towards EOS (id 1): some beams end early, others do not."""
    path = tmp_path_factory.mktemp("eos-prone")
    hf = build_checkpoint(path, "gpt2", seed=0)
    with torch.no_grad():
        hf.transformer.ln_f.bias += 60 * hf.transformer.wte.weight[1]
    hf.save_pretrained(path)
    return str(path), hf


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_beam_search_matches_transformers(eos_prone_gpt2, early_stopping):
    path, hf = eos_prone_gpt2
    prompts = _prompts(hf.config.vocab_size, 3, seed=11)
    llm = LLM(path, num_gpu_blocks=128)
    lengths = []
    for prompt in prompts:
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=12,
                num_beams=3,
                num_return_sequences=2,
                early_stopping=early_stopping,
                length_penalty=1.5,
                eos_token_id=1,
                pad_token_id=0,
                do_sample=False,
            )
        params = SamplingParams(
            n=2,
            best_of=3,
            use_beam_search=True,
            temperature=0,
            max_tokens=12,
            early_stopping=early_stopping,
            length_penalty=1.5,
        )
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
        got = [o.token_ids for o in out.outputs]
        expect = []
        for row in want[:, len(prompt) :].tolist():
            expect.append(row[: row.index(1) + 1] if 1 in row else row)
        assert got == expect, (early_stopping, prompt)
        lengths += [len(t) for t in got]
    # EOS really ended beams (early_stopping=True stops at the first full set; "never" searches on and, with
    # length_penalty 1.5 favouring length, returns full-length beams)
    assert min(lengths) < 12 if early_stopping != "never" else max(lengths) == 12
    assert not llm.llm_engine.scheduler.block_manager.block_tables  # every beam's blocks were freed


def test_abort_frees_blocks_in_every_state(checkpoint):
    path, hf = checkpoint("llama")
    llm = LLM(path, block_size=8, num_gpu_blocks=12, max_model_len=96, num_cpu_blocks=32)
    engine = llm.llm_engine
    for i, p in enumerate(_prompts(hf.config.vocab_size, 6, lo=20, hi=30)):
        engine.add_request(
            str(i),
            prompt_token_ids=p,
            # the pair's worst case (2 x 6 blocks, no sharing) must fit the pool, or it is refused up front
            params=SamplingParams(
                n=2 if i == 1 else 1, temperature=1.0, max_tokens=20 if i == 1 else 40, ignore_eos=True
            ),
        )
    for _ in range(12):
        engine.step()
    sched = engine.scheduler
    assert sched.running and sched.waiting  # a mix of states
    groups = [engine.requests[r].group for r in list(engine.requests)]
    engine.abort_request(list(engine.requests))
    assert not engine.has_unfinished_requests() and not engine.requests
    assert all(
        s.status == SequenceStatus.FINISHED_ABORTED
        for g in groups
        for s in g.get_seqs()
        if not s.is_finished() or s.status == SequenceStatus.FINISHED_ABORTED
    )
    assert sched.block_manager.get_num_free_gpu_blocks() == 12 and sched.block_manager.get_num_free_cpu_blocks() == 32
    assert engine.step() == []


def test_too_long_prompt_is_ignored_with_a_reason_while_others_run(checkpoint):
    path, hf = checkpoint("llama")
    llm = LLM(path, num_gpu_blocks=64, max_model_len=64)
    prompts = [[5] * 70, [6] * 10]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=4), use_tqdm=False)
    assert outs[0].finished and outs[0].outputs[0].finish_reason == "length" and not outs[0].outputs[0].token_ids
    assert "max_model_len=64" in outs[0].ignored_reason
    assert len(outs[1].outputs[0].token_ids) == 4


def test_engine_runs_on_the_triton_kernels(checkpoint, monkeypatch):
    """The same greedy tokens through the Triton kernels (interpreted on CPU, compiled on CUDA)."""
    path, hf = checkpoint("llama")
    prompts = _prompts(hf.config.vocab_size, 2, lo=5, hi=12)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    want = [
        o.outputs[0].token_ids
        for o in LLM(path, block_size=16, num_gpu_blocks=8, max_model_len=64).generate(
            prompt_token_ids=prompts, sampling_params=params, use_tqdm=False
        )
    ]
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    got = LLM(path, block_size=16, num_gpu_blocks=8, max_model_len=64).generate(
        prompt_token_ids=prompts, sampling_params=params, use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in got] == want
