"""``LLM.beam_search`` (vLLM ``entrypoints/llm.py``, ``vllm/beam_search.py``) and ``get_tokenizer`` /
``set_tokenizer`` (the pooling methods' refusals are in ``test_vllm_surface.py``).

vLLM's beam search keeps, each step, the ``beam_width`` best extensions among each beam's ``2 * beam_width`` most
likely tokens; EOS extensions leave as completed; the final ranking divides the cumulative logprob by the length
(prompt included, a final EOS not) to the ``length_penalty``. Where no beam ends (``ignore_eos``) and all beams have
one length, that is transformers' beam search; with EOS and length penalties it is checked against a reference
computed here from transformers' model with those rules.
"""

from __future__ import annotations

import pytest
import torch
from paged_serve import LLM, SamplingParams
from paged_serve.beam_search import BeamSearchOutput, BeamSearchSequence, get_beam_search_score
from paged_serve.sampling_params import BeamSearchParams
from transformers import PreTrainedTokenizerFast

from .conftest import build_checkpoint

PROMPTS = [[5, 17, 33, 8, 40], [60, 2, 9]]


@pytest.fixture(scope="module")
def llm(checkpoint):
    path, hf = checkpoint("llama")
    engine = LLM(path, num_gpu_blocks=64, max_num_seqs=16, dtype="float32")
    engine.hf, engine.path = hf, path
    return engine


def test_beam_search_params_are_vllms():
    p = BeamSearchParams(beam_width=2, max_tokens=3)
    assert (p.ignore_eos, p.temperature, p.length_penalty, p.include_stop_str_in_output) == (False, 0.0, 1.0, False)


def test_without_eos_the_beams_are_transformers_beams(llm):
    width, steps = 3, 6
    outs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS],
                           BeamSearchParams(beam_width=width, max_tokens=steps, ignore_eos=True))  # fmt: skip
    assert all(isinstance(o, BeamSearchOutput) and len(o.sequences) == width for o in outs)
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            ref = llm.hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width,
                                  max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0,
                                  early_stopping=False, output_scores=True, return_dict_in_generate=True)  # fmt: skip
        assert [s.tokens for s in out.sequences] == ref.sequences.tolist()
        # transformers scores sum(logprob) / generated_len; vLLM's cum_logprob is that sum
        want = (ref.sequences_scores * steps).tolist()
        assert [s.cum_logprob for s in out.sequences] == pytest.approx(want, abs=1e-4)
        assert all(isinstance(s, BeamSearchSequence) and len(s.logprobs) == steps for s in out.sequences)
        tok = llm.get_tokenizer()
        assert [s.text for s in out.sequences] == [tok.decode(s.tokens, skip_special_tokens=False)
                                                   for s in out.sequences]  # fmt: skip


def _reference(model, prompt, width, steps, eos, length_penalty, ignore_eos):
    """vLLM's rules computed on transformers' model: per beam the top 2 x width tokens, EOS ones completed."""

    def score(tokens, cum):
        return cum / max(len(tokens) - (tokens[-1] == eos), 1) ** length_penalty

    beams, completed = [(list(prompt), 0.0)], []
    for _ in range(steps):
        if not beams:
            break
        live = []
        for tokens, cum in beams:
            with torch.no_grad():
                logp = model(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
            top = logp.topk(2 * width)
            for lp, t in zip(top.values.tolist(), top.indices.tolist()):
                (completed if t == eos and not ignore_eos else live).append((tokens + [t], cum + lp))
        beams = sorted(live, key=lambda b: score(*b), reverse=True)[:width]
    return sorted(completed + beams, key=lambda b: score(*b), reverse=True)[:width], len(completed)


@pytest.fixture(scope="module")
def eos_prone(tmp_path_factory):
    """A checkpoint whose EOS row copies another token's (scaled), so EOS is often among the candidates."""
    path = tmp_path_factory.mktemp("eos-prone")
    model = build_checkpoint(path, "llama", seed=3)
    with torch.no_grad():
        model.lm_head.weight[1] = 1.3 * model.lm_head.weight[7]
    model.save_pretrained(path)
    return str(path), model


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_eos_completion_and_length_penalty_match_a_reference(eos_prone, length_penalty):
    path, model = eos_prone
    llm = LLM(path, num_gpu_blocks=64, max_num_seqs=16, dtype="float32")
    eos = llm.get_tokenizer().eos_token_id
    width, steps = 2, 5
    params = BeamSearchParams(beam_width=width, max_tokens=steps, length_penalty=length_penalty)
    ended = completed = 0
    for prompt in PROMPTS + [[40, 40, 7]]:
        got = llm.beam_search([{"prompt_token_ids": prompt}], params)[0].sequences
        want, num_completed = _reference(model, prompt, width, steps, eos, length_penalty, ignore_eos=False)
        completed += num_completed
        assert [s.tokens for s in got] == [t for t, _ in want]
        assert [s.cum_logprob for s in got] == pytest.approx([c for _, c in want], abs=1e-4)
        scores = [get_beam_search_score(s.tokens, s.cum_logprob, eos, length_penalty) for s in got]
        assert scores == sorted(scores, reverse=True)
        ended += sum(s.tokens[-1] == eos for s in got)
    assert completed > 0  # the EOS path really ran
    assert ended > 0 or length_penalty > 1  # a penalty above 1 favours the longer, unfinished beams


def test_text_prompts_concurrency_limit_and_refusals(llm):
    tok = llm.get_tokenizer()
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    by_text = llm.beam_search([{"prompt": "the quick brown"}, {"prompt": "lazy dog"}], params)
    by_ids = llm.beam_search([{"prompt_token_ids": tok.encode(t)} for t in ("the quick brown", "lazy dog")], params,
                             concurrency_limit=1)  # fmt: skip
    assert [[s.tokens for s in o.sequences] for o in by_text] == [[s.tokens for s in o.sequences] for o in by_ids]
    with pytest.raises(ValueError, match="beam_width"):
        llm.beam_search([{"prompt": "the"}], BeamSearchParams(beam_width=0, max_tokens=3))
    with pytest.raises(ValueError, match="logprobs=22 exceeds max_logprobs=20"):
        llm.beam_search([{"prompt": "the"}], BeamSearchParams(beam_width=11, max_tokens=3))
    with pytest.raises(ValueError, match="lora_request"):
        llm.beam_search([{"prompt": "the"}], params, lora_request=object())


def test_set_tokenizer_takes_a_transformers_tokenizer(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    before = llm.generate("the quick brown", greedy, use_tqdm=False)[0].outputs[0]
    own = llm.get_tokenizer()
    hf_tok = PreTrainedTokenizerFast.from_pretrained(llm.path)
    try:
        llm.set_tokenizer(hf_tok)
        assert llm.get_tokenizer() is hf_tok
        after = llm.generate("the quick brown", greedy, use_tqdm=False)[0].outputs[0]
        assert after.token_ids == before.token_ids and after.text == before.text
    finally:
        llm.set_tokenizer(own)
    assert llm.get_tokenizer() is own
