"""generate() token-identical to transformers on the same weights: greedy, beam search, sampling with a seed."""

import pytest
import torch
import transformers
from hf_lite import GenerationConfig, LlamaForCausalLM
from hf_lite_testing import make_model


def _pair(kind, tmp_path, **kw):
    ours = make_model(kind, **kw)
    ours.save_pretrained(tmp_path / kind)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / kind).eval()
    return ours, theirs


def _left_padded(pad_id, seed=0, batch=4, length=7, vocab=97):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate([3, 0, 1, 5][:batch]):
        ids[row, :n_pad] = pad_id
        mask[row, :n_pad] = 0
    return ids, mask


def _eos_ids_that_get_hit(theirs, ids, mask, pad):
    """Pick EOS ids from a free run so that several rows stop early."""
    free = theirs.generate(
        ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=pad
    )
    new = free[:, ids.shape[1] :]
    return sorted({int(new[0, 2]), int(new[2, 5])})


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_batched_left_padded_with_eos_matches_transformers(kind, tmp_path):
    ours, theirs = _pair(kind, tmp_path)
    pad = 3
    ids, mask = _left_padded(pad)
    eos = _eos_ids_that_get_hit(theirs, ids, mask, pad)
    kw = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=eos, pad_token_id=pad)
    expected = theirs.generate(ids, do_sample=False, **kw)
    got = ours.generate(ids, **kw)
    assert torch.equal(got, expected)
    new = got[:, ids.shape[1] :]
    finished_early = [(new[r, :-1] == pad).any() and any((new[r] == e).any() for e in eos) for r in range(4)]
    assert sum(bool(f) for f in finished_early) >= 1, "sanity: some row must stop on EOS and be padded"


BEAM_CASES = [
    dict(num_beams=3, length_penalty=1.0, early_stopping=False, num_return_sequences=1),
    dict(num_beams=4, length_penalty=2.0, early_stopping=True, num_return_sequences=2),
    dict(num_beams=3, length_penalty=-0.5, early_stopping="never", num_return_sequences=3),
    dict(num_beams=2, length_penalty=0.0, early_stopping=False, num_return_sequences=2),
]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_beam_search_matches_transformers(kind, tmp_path):
    ours, theirs = _pair(kind, tmp_path)
    pad = 3
    ids, mask = _left_padded(pad, seed=1)
    eos = _eos_ids_that_get_hit(theirs, ids, mask, pad)
    for case in BEAM_CASES:
        kw = dict(attention_mask=mask, max_new_tokens=9, eos_token_id=eos, pad_token_id=pad, **case)
        expected = theirs.generate(ids, do_sample=False, return_dict_in_generate=True, output_scores=True, **kw)
        got = ours.generate(ids, return_dict_in_generate=True, output_scores=True, **kw)
        assert torch.equal(got.sequences, expected.sequences), case
        torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)
    assert (got.sequences == eos[0]).any() or (got.sequences == eos[-1]).any(), "sanity: beams must hit EOS"


def test_sampling_with_fixed_seed_matches_transformers(tmp_path):
    ours, theirs = _pair("llama", tmp_path)
    ids, mask = _left_padded(0, seed=2)
    for case in [
        dict(top_k=20, top_p=0.9, temperature=0.7),
        dict(top_k=0, min_p=0.05, temperature=1.3),
        dict(num_return_sequences=2, top_k=10),
    ]:
        kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=True, pad_token_id=0, eos_token_id=2, **case)
        torch.manual_seed(123)
        expected = theirs.generate(ids, **kw)
        torch.manual_seed(123)
        got = ours.generate(ids, **kw)
        assert torch.equal(got, expected), case
    torch.manual_seed(7)
    other = ours.generate(ids, **kw)
    assert not torch.equal(other, got), "sanity: another seed samples differently"


def test_beam_sampling_with_fixed_seed_matches_transformers(tmp_path):
    ours, theirs = _pair("gpt2", tmp_path)
    ids, mask = _left_padded(3, seed=3)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=True,
        num_beams=3,
        num_return_sequences=2,
        top_k=30,
        temperature=0.8,
        pad_token_id=3,
        eos_token_id=[0, 11],
    )
    torch.manual_seed(5)
    expected = theirs.generate(ids, **kw)
    torch.manual_seed(5)
    assert torch.equal(ours.generate(ids, **kw), expected)


def test_processors_inside_generate_match_transformers(tmp_path):
    """Repetition penalty, no-repeat-ngram, bad words, suppress tokens and min_new_tokens together (order matters)."""
    ours, theirs = _pair("gpt2", tmp_path)
    pad = 3
    ids, mask = _left_padded(pad, seed=4)
    eos = _eos_ids_that_get_hit(theirs, ids, mask, pad)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=12,
        eos_token_id=eos,
        pad_token_id=pad,
        repetition_penalty=1.7,
        no_repeat_ngram_size=2,
        bad_words_ids=[[11], [40, 41]],
        suppress_tokens=[12, 13],
        min_new_tokens=4,
    )
    expected = theirs.generate(ids, do_sample=False, **kw)
    got = ours.generate(ids, **kw)
    assert torch.equal(got, expected)
    plain = ours.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=pad)
    assert not torch.equal(plain, got), "sanity: the processors change the output"


def test_generation_config_json_saved_and_loaded_with_the_model(tmp_path):
    model = make_model("llama")
    model.generation_config = GenerationConfig(max_new_tokens=5, do_sample=True, top_k=7, eos_token_id=[2, 9])
    model.save_pretrained(tmp_path)
    theirs = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (theirs.max_new_tokens, theirs.do_sample, theirs.top_k, theirs.eos_token_id) == (5, True, 7, [2, 9])
    loaded = LlamaForCausalLM.from_pretrained(tmp_path)
    assert loaded.generation_config == model.generation_config
    out = loaded.generate(torch.tensor([[5, 6, 7]]), do_sample=False, eos_token_id=None)
    assert out.shape == (1, 8)  # max_new_tokens came from generation_config.json
    # and a config transformers wrote loads in hf-lite
    transformers.GenerationConfig(num_beams=4, length_penalty=0.5).save_pretrained(tmp_path / "hf")
    ours = GenerationConfig.from_pretrained(tmp_path / "hf")
    assert ours.num_beams == 4 and ours.length_penalty == 0.5


def test_generate_rejects_bad_arguments():
    model = make_model("gpt2")
    ids = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(ids, num_beams=0)
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(ids, num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="smaller or equal to `num_beams`"):
        model.generate(ids, do_sample=True, num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="early_stopping"):
        model.generate(ids, num_beams=2, early_stopping="sometimes")
    with pytest.raises(ValueError, match="not used by the model"):
        model.generate(ids, bogus_flag=1)
    with pytest.raises(ValueError, match="stop strings"):
        model.generate(ids, stop_strings=["x"])
    with pytest.raises(ValueError, match="2D"):
        model.generate(torch.tensor([5, 6]))


def test_generate_uses_given_position_ids():
    model = make_model("gpt2")
    ids = torch.tensor([[5, 6, 7, 8]])
    default = model.generate(ids, max_new_tokens=6, eos_token_id=None)
    same = model.generate(ids, max_new_tokens=6, eos_token_id=None, position_ids=torch.arange(4)[None])
    shifted = model.generate(ids, max_new_tokens=6, eos_token_id=None, position_ids=torch.arange(20, 24)[None])
    assert torch.equal(default, same)
    assert not torch.equal(default, shifted), "sanity: GPT-2's learned positions change the continuation"


@pytest.mark.parametrize(
    "case",
    [
        dict(num_beams=3, num_return_sequences=2),
        dict(do_sample=True, num_return_sequences=3, top_k=20),
        dict(do_sample=True, num_beams=2, num_return_sequences=2, top_k=20),
    ],
    ids=["beam", "sample", "beam_sample"],
)
def test_repetition_penalty_with_expanded_batch_matches_transformers(case, tmp_path):
    """The penalty's per-row padding lengths are built after the batch is expanded to beams / return sequences."""
    ours, theirs = _pair("llama", tmp_path)
    ids, mask = _left_padded(0, seed=6)
    kw = dict(attention_mask=mask, max_new_tokens=6, repetition_penalty=1.8, pad_token_id=0, eos_token_id=2, **case)
    torch.manual_seed(11)
    expected = theirs.generate(ids, **kw)
    torch.manual_seed(11)
    got = ours.generate(ids, **kw)
    assert got.shape[0] == ids.shape[0] * case["num_return_sequences"]
    assert torch.equal(got, expected)


def test_generate_without_input_ids_starts_from_bos_like_transformers(tmp_path):
    ours, theirs = _pair("gpt2", tmp_path)
    kw = dict(max_new_tokens=5, eos_token_id=None, bos_token_id=7)
    got = ours.generate(**kw)
    assert got[0, 0] == 7 and got.shape == (1, 6)
    assert torch.equal(got, theirs.generate(**kw))
    beams = dict(kw, num_beams=2, num_return_sequences=2)
    assert torch.equal(ours.generate(**beams), theirs.generate(**beams))
    with pytest.raises(ValueError, match="`bos_token_id` has to be defined"):
        ours.generate(max_new_tokens=2, bos_token_id=None)


def test_negative_eos_token_id_warns_and_generates_to_max_length_like_transformers(tmp_path, caplog):
    ours, theirs = _pair("gpt2", tmp_path)
    ids = torch.randint(5, 97, (2, 5), generator=torch.Generator().manual_seed(2))
    for case in [dict(), dict(num_beams=2)]:
        kw = dict(max_new_tokens=4, eos_token_id=-1, pad_token_id=3, **case)
        with caplog.at_level("WARNING"):
            got = ours.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        assert "should consist of positive integers" in caplog.text
        assert got.shape == (2, 9)
        assert torch.equal(got, theirs.generate(ids, attention_mask=torch.ones_like(ids), **kw))


# ---------------------------------------------------------------- ports of transformers' GenerationTesterMixin
def _mixin_kwargs(max_length):
    """What upstream's _get_logits_processor_kwargs passes to every generate call."""
    return dict(
        min_length=max_length - 1,
        bad_words_ids=[[1, 0]],
        no_repeat_ngram_size=2,
        repetition_penalty=1.2,
        remove_invalid_values=True,
    )


MIXIN_MODES = {
    "greedy": dict(do_sample=False, num_beams=1),
    "sample": dict(do_sample=True, num_beams=1, num_return_sequences=2, top_k=10, top_p=0.7, temperature=0.7),
    "beam_search": dict(do_sample=False, num_beams=2, num_return_sequences=2, early_stopping=False, length_penalty=2.0),
    "beam_sample": dict(do_sample=True, num_beams=2, num_return_sequences=2, top_k=10, top_p=0.7, temperature=0.7),
}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_generate_dict_outputs_match_transformers(kind, tmp_path):
    """test_greedy_generate_dict_outputs, test_sample_generate_dict_output, test_beam_search_generate_dict_output,
    test_beam_sample_generate_dict_output: sequences, per-step scores and their shapes."""
    ours, theirs = _pair(kind, tmp_path)
    ids = torch.randint(3, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    max_length = ids.shape[1] + 3
    for name, mode in MIXIN_MODES.items():
        kw = dict(
            attention_mask=mask,
            max_length=max_length,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
            **_mixin_kwargs(max_length),
            **mode,
        )
        torch.manual_seed(0)
        expected = theirs.generate(ids, **kw)
        torch.manual_seed(0)
        got = ours.generate(ids, **kw)
        rows = ids.shape[0] * mode.get("num_return_sequences", 1)
        assert got.sequences.shape == (rows, max_length) and torch.equal(got.sequences, expected.sequences), name
        assert len(got.scores) == len(expected.scores) == max_length - ids.shape[1], name
        beams = ids.shape[0] * mode["num_beams"] if mode["num_beams"] > 1 else rows
        for a, b in zip(got.scores, expected.scores):
            assert a.shape == (beams, 97)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
        if mode["num_beams"] > 1:
            assert got.sequences_scores.shape == (rows,) and got.beam_indices.shape == (rows, 3)
            torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)
            assert torch.equal(got.beam_indices, expected.beam_indices[:, :3]), name


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_left_padding_compatibility(kind):
    """Upstream's test_left_padding_compatibility: left padding with the mask (and the position ids generate
    derives from it) leaves the last token's logits unchanged."""
    model = make_model(kind)
    ids = torch.randint(3, 97, (2, 6), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.full((2, 3), 3), ids], dim=1)
    mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        plain = model(input_ids=ids).logits[:, -1]
        left = model(input_ids=padded, attention_mask=mask, position_ids=positions).logits[:, -1]
    torch.testing.assert_close(left, plain, rtol=1e-5, atol=1e-5)
    greedy = model.generate(padded, attention_mask=mask, max_new_tokens=5, eos_token_id=None, pad_token_id=3)
    assert torch.equal(greedy[:, 9:], model.generate(ids, max_new_tokens=5, eos_token_id=None)[:, 6:])


def test_right_padding_warns_as_transformers_does(caplog):
    """transformers' generate warns on right-padded batches of a decoder-only model (from the mask, else the ids)."""
    import logging

    import transformers

    model = make_model("llama")
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    message = "right-padding was detected"
    t_logger = logging.getLogger("transformers.generation.utils")
    for mask, warns in ((right, True), (left, False), (None, True)):
        caplog.clear()
        kw = {} if mask is None else {"attention_mask": mask}
        with caplog.at_level(logging.WARNING, logger="hf_lite"):
            model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0, **kw)
        ours = any(message in r.getMessage() for r in caplog.records)
        assert ours is warns, (mask, ours)
    # transformers on the same inputs (its logger does not propagate: listen on it directly)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    t_logger.addHandler(handler)
    try:
        theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model.config.to_dict())).eval()
        theirs.generate(ids, attention_mask=right, max_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        t_logger.removeHandler(handler)
    assert any(message in m for m in seen)
