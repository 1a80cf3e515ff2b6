"""Every logits processor against hand-computed expectations, and against transformers' own on random scores.

The second half ports transformers' tests/generation/test_logits_process.py for the processors hf-lite has.
"""

import inspect
import math

import hf_lite
import hf_lite.generation
import pytest
import torch
import transformers
import transformers.generation.logits_process as T
from hf_lite.generation import logits_process as L
from hf_lite_testing import make_model

INF = -float("inf")


def test_temperature():
    scores = torch.tensor([[1.0, 2.0, -4.0]])
    assert L.TemperatureLogitsWarper(0.5)(None, scores).tolist() == [[2.0, 4.0, -8.0]]
    with pytest.raises(ValueError, match="temperature"):
        L.TemperatureLogitsWarper(0.0)


def test_top_k_keeps_ties():
    scores = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert L.TopKLogitsWarper(2)(None, scores).tolist() == [[INF, 3.0, INF, 3.0, INF]]
    assert L.TopKLogitsWarper(3)(None, scores).tolist() == [[INF, 3.0, 2.0, 3.0, INF]]
    with pytest.raises(ValueError, match="top_k"):
        L.TopKLogitsWarper(0)


def test_top_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = L.TopPLogitsWarper(0.75)(None, probs.log())
    # cumulative from the top: 0.5, 0.8 -> the first two reach 0.75
    assert torch.isinf(out).tolist() == [[False, False, True, True]]
    out = L.TopPLogitsWarper(0.1, min_tokens_to_keep=3)(None, probs.log())
    assert torch.isinf(out).tolist() == [[False, False, False, True]]


def test_min_p():
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    out = L.MinPLogitsWarper(0.2)(None, probs.log())  # threshold 0.12
    assert torch.isinf(out).tolist() == [[False, False, True, True]]


def test_repetition_penalty_divides_positive_multiplies_negative():
    scores = torch.tensor([[2.0, -2.0, 1.0, 4.0]])
    ids = torch.tensor([[0, 1, 1]])
    assert L.RepetitionPenaltyLogitsProcessor(2.0)(ids, scores).tolist() == [[1.0, -4.0, 1.0, 4.0]]
    # prompt_ignore_length (per row) excludes left padding
    out = L.RepetitionPenaltyLogitsProcessor(2.0, prompt_ignore_length=torch.tensor([1]))(ids, scores)
    assert out.tolist() == [[2.0, -4.0, 1.0, 4.0]]


def test_no_repeat_ngram():
    ids = torch.tensor([[1, 2, 3, 1, 2], [4, 4, 4, 4, 4]])
    out = L.NoRepeatNGramLogitsProcessor(3)(ids, torch.zeros(2, 6))
    assert torch.isinf(out).nonzero().tolist() == [[0, 3], [1, 4]]  # "1 2 3" and "4 4 4" seen
    out = L.NoRepeatNGramLogitsProcessor(2)(ids, torch.zeros(2, 6))
    assert torch.isinf(out).nonzero().tolist() == [[0, 3], [1, 4]]


def test_min_length_and_min_new_tokens():
    scores = torch.zeros(1, 5)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.isinf(L.MinLengthLogitsProcessor(4, [2, 4])(ids, scores)).nonzero().tolist() == [[0, 2], [0, 4]]
    assert not torch.isinf(L.MinLengthLogitsProcessor(3, 2)(ids, scores)).any()
    assert torch.isinf(L.MinNewTokensLengthLogitsProcessor(2, 2, 1)(ids, scores)).nonzero().tolist() == [[0, 1]]
    assert not torch.isinf(L.MinNewTokensLengthLogitsProcessor(1, 2, 1)(ids, scores)).any()


def test_suppress_tokens_and_bad_words():
    scores = torch.zeros(2, 6)
    assert torch.isinf(L.SuppressTokensLogitsProcessor([1, 5])(None, scores)).nonzero().tolist() == [
        [0, 1],
        [0, 5],
        [1, 1],
        [1, 5],
    ]
    ids = torch.tensor([[0, 3, 4], [0, 4, 3]])
    out = L.NoBadWordsLogitsProcessor([[2], [3, 4, 5]], eos_token_id=0)(ids, scores)
    assert torch.isinf(out).nonzero().tolist() == [[0, 2], [0, 5], [1, 2]]
    with pytest.raises(ValueError, match="bad_words_ids"):
        L.NoBadWordsLogitsProcessor([[1, -1]])


def _transformers_pairs():
    return [
        (L.TemperatureLogitsWarper(0.7), T.TemperatureLogitsWarper(0.7)),
        (L.TopKLogitsWarper(5, min_tokens_to_keep=2), T.TopKLogitsWarper(5, min_tokens_to_keep=2)),
        (L.TopPLogitsWarper(0.8), T.TopPLogitsWarper(0.8)),
        (L.MinPLogitsWarper(0.1, min_tokens_to_keep=2), T.MinPLogitsWarper(0.1, min_tokens_to_keep=2)),
        (L.RepetitionPenaltyLogitsProcessor(1.5), T.RepetitionPenaltyLogitsProcessor(1.5)),
        (L.NoRepeatNGramLogitsProcessor(2), T.NoRepeatNGramLogitsProcessor(2)),
        (L.MinLengthLogitsProcessor(30, [1, 2]), T.MinLengthLogitsProcessor(30, [1, 2])),
        (L.MinNewTokensLengthLogitsProcessor(5, 30, 3), T.MinNewTokensLengthLogitsProcessor(5, 30, 3)),
        (L.SuppressTokensLogitsProcessor([0, 7]), T.SuppressTokensLogitsProcessor([0, 7])),
        (L.NoBadWordsLogitsProcessor([[4], [5, 6]], 1), T.NoBadWordsLogitsProcessor([[4], [5, 6]], 1)),
        (L.InfNanRemoveLogitsProcessor(), T.InfNanRemoveLogitsProcessor()),
    ]


def test_every_processor_equals_transformers_on_random_scores():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, 12, (4, 20), generator=g)
        scores = torch.randn(4, 12, generator=g) * 3
        for ours, theirs in _transformers_pairs():
            torch.testing.assert_close(
                ours(ids, scores.clone()), theirs(ids, scores.clone()), msg=lambda m, o=ours: f"{type(o).__name__}: {m}"
            )


def test_processor_list_applies_in_order():
    lst = L.LogitsProcessorList([L.TemperatureLogitsWarper(0.5), L.TopKLogitsWarper(1)])
    out = lst(None, torch.tensor([[1.0, 2.0]]))
    assert out.tolist() == [[INF, 4.0]]
    assert math.isinf(out[0, 0])


# ---------------------------------------------------------------- ports of transformers' test_logits_process.py
def _uniform(batch, length):
    return torch.ones((batch, length)) / length


def _ids(shape, vocab=20, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_min_length_dist_processor():
    proc = L.MinLengthLogitsProcessor(min_length=10, eos_token_id=0)
    assert proc(_ids((4, 5)), _uniform(4, 20))[:, 0].tolist() == 4 * [INF]
    assert not torch.isinf(proc(_ids((4, 15)), _uniform(4, 20))).any()


@pytest.mark.parametrize("eos_token_id", [0, [0, 18]])
def test_new_min_length_dist_processor(eos_token_id):
    proc = L.MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3, eos_token_id=eos_token_id)
    expected = 4 * [INF] * (len(eos_token_id) if isinstance(eos_token_id, list) else 1)
    for length in (2, 5, 6, 7):
        assert proc(_ids((4, length)), _uniform(4, 20))[:, eos_token_id].flatten().tolist() == expected, length
    for length in (8, 15):
        assert not torch.isinf(proc(_ids((4, length)), _uniform(4, 20))).any(), length


def test_temperature_dist_warper():
    scores = _uniform(2, 20)
    scores[1, 5], scores[1, 10] = 1 / 20 + 0.1, 1 / 20 - 0.4
    probs = torch.softmax(scores, -1)
    sharp = torch.softmax(L.TemperatureLogitsWarper(0.5)(None, scores), -1)
    smooth = torch.softmax(L.TemperatureLogitsWarper(1.3)(None, scores), -1)
    torch.testing.assert_close(probs[0], sharp[0], rtol=1e-3, atol=1e-3)  # uniform stays uniform
    torch.testing.assert_close(probs[0], smooth[0], rtol=1e-3, atol=1e-3)
    assert probs[1].max() < sharp[1].max() and probs[1].min() > sharp[1].min()
    assert probs[1].max() > smooth[1].max() and probs[1].min() < smooth[1].min()
    assert not torch.all(scores == L.TemperatureLogitsWarper(1.3)(None, scores)), "not in place"


def _rep_scores():
    scores = _uniform(2, 10)
    scores[0, 0], scores[1, 5] = -(1 / 10), 4 / 10
    return scores


def test_repetition_penalty_dist_process():
    ids = torch.tensor([[0, 1], [5, 0]])
    scores = _rep_scores()
    out = L.RepetitionPenaltyLogitsProcessor(penalty=2.0)(ids, scores)
    assert out[0, 0].item() == pytest.approx(-(1 / 10) * 2) and out[0, 1].item() == pytest.approx(1 / 20)
    assert out[1, 0].item() == pytest.approx(1 / 20) and out[1, 5].item() == pytest.approx(4 / 20)
    assert not torch.all(scores == out)
    # prompt_ignore_length: the prompt itself is not penalised, tokens after it are
    unchanged = L.RepetitionPenaltyLogitsProcessor(2.0, prompt_ignore_length=2)(ids, _rep_scores())
    assert torch.equal(unchanged, _rep_scores())
    longer = torch.tensor([[0, 1, 0, 1], [5, 0, 5, 0]])
    torch.testing.assert_close(
        L.RepetitionPenaltyLogitsProcessor(2.0, prompt_ignore_length=2)(longer, _rep_scores()), out
    )


def test_top_k_dist_warper():
    ramp = torch.arange(10.0).repeat(2, 1)
    ramp[1:, :5] += 10
    out = L.TopKLogitsWarper(3)(None, ramp)
    assert torch.isinf(out[0]).tolist() == 7 * [True] + 3 * [False]
    assert torch.isinf(out[1]).tolist() == 2 * [True] + 3 * [False] + 5 * [True]
    safety = L.TopKLogitsWarper(top_k=1, filter_value=0.0, min_tokens_to_keep=3)
    assert (safety(None, _uniform(2, 5)) == 0.0).long().sum(-1).tolist() == [0, 0]  # uniform is not changed
    assert (safety(None, torch.arange(5.0).repeat(2, 1)) == 0.0).long().sum(-1).tolist() == [2, 2]


def test_top_p_dist_warper():
    dist = torch.log(torch.tensor([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]]))
    filtered = torch.exp(L.TopPLogitsWarper(0.8)(None, dist))
    torch.testing.assert_close(
        filtered, torch.tensor([[0.3, 0.0, 0.0, 0.5], [0.0, 0.3, 0.3, 0.25]]), rtol=1e-3, atol=1e-3
    )
    ramp = torch.arange(10.0).repeat(2, 1) - 5
    ramp[1] *= 100.0
    kept = L.TopPLogitsWarper(0.9, min_tokens_to_keep=2, filter_value=0.0)(None, ramp)
    assert (kept != 0.0).long().sum(-1).tolist() == [3, 2]


def test_min_p_dist_warper():
    dist = torch.log(torch.tensor([[0.9, 0.0274, 0.047, 0.0274], [0.15, 0.3, 0.3, 0.25], [0.97, 0.01, 0.01, 0.01]]))
    filtered = torch.exp(L.MinPLogitsWarper(0.05)(None, dist))
    expected = torch.tensor([[0.9, 0.0, 0.047, 0.0], [0.15, 0.3, 0.3, 0.25], [0.97, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(filtered, expected, rtol=1e-3, atol=1e-3)
    ramp = torch.arange(10.0).repeat(2, 1) - 5
    ramp[1] *= 100.0
    kept = L.MinPLogitsWarper(0.9, min_tokens_to_keep=2, filter_value=0.0)(None, ramp)
    assert (kept != 0.0).long().sum(-1).tolist() == [2, 2]


def test_no_repeat_ngram_dist_processor():
    ids = torch.tensor([[1, 1, 2, 1], [0, 1, 0, 1]])
    scores = _uniform(2, 3)
    assert torch.isinf(L.NoRepeatNGramLogitsProcessor(2)(ids, scores)).tolist() == [
        [False, True, True],
        [True, False, False],
    ]
    assert torch.isinf(L.NoRepeatNGramLogitsProcessor(3)(ids, scores)).tolist() == [
        [False, False, False],
        [True, False, False],
    ]
    # a later n-gram ending in the banned token without repeating the prefix must not undo the ban
    ids = torch.tensor([[1, 2, 5, 7, 8, 5, 1, 2]])
    assert torch.isinf(L.NoRepeatNGramLogitsProcessor(3)(ids, _uniform(1, 10))).nonzero()[:, 1].tolist() == [5]
    # one token short of a 3-gram: nothing banned yet
    assert not torch.isinf(L.NoRepeatNGramLogitsProcessor(3)(torch.tensor([[1, 2], [0, 1]]), scores)).any()


def test_no_bad_words_dist_processor():
    ids = torch.tensor([[0, 1, 3, 1], [0, 1, 0, 1]])
    bad = [[1], [4], [1, 0], [0, 1, 2], [1, 3, 1, 3]]
    scores = _uniform(2, 5)
    out = L.NoBadWordsLogitsProcessor(bad_words_ids=bad, eos_token_id=4)(ids, scores)
    # the EOS entry [4] is not banned, so generation can still stop
    assert torch.isinf(out).tolist() == [[True, True, False, True, False], [True, True, True, False, False]]
    assert not torch.all(scores == out)
    torch.testing.assert_close(L.NoBadWordsLogitsProcessor(bad_words_ids=[[4]], eos_token_id=4)(ids, scores), scores)


def test_processor_list():
    ids = _ids((4, 10), vocab=15)
    original = ids.clone()
    processors = [
        L.MinLengthLogitsProcessor(10, 0),
        L.TemperatureLogitsWarper(0.5),
        L.RepetitionPenaltyLogitsProcessor(2.0),
        L.TopKLogitsWarper(3),
        L.TopPLogitsWarper(0.8),
        L.NoRepeatNGramLogitsProcessor(2),
        L.NoBadWordsLogitsProcessor([[1]], 0),
    ]
    scores = _uniform(4, 15)
    for proc in processors:
        scores = proc(ids, scores)
    torch.testing.assert_close(L.LogitsProcessorList(processors)(ids, _uniform(4, 15)), scores)
    assert torch.equal(ids, original), "input_ids are never changed"


def test_remove_nan_inf_logits_processor():
    scores = torch.tensor([[0.0, 0.7, 0.8, float("nan")], [0.1, float("inf"), 0.3, float("-inf")]])
    out = L.InfNanRemoveLogitsProcessor()(_ids((2, 4)), scores)
    finfo = torch.finfo(out.dtype)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.7, 0.8, 0.0], [0.1, finfo.max, 0.3, finfo.min]]))
    assert not torch.all(scores == out), "not in place"


# ---------------------------------------------------------------------- the processors scripts build themselves:
# transformers' tests of typical, epsilon, eta, forced BOS/EOS, exponential decay, normalization, suppress-at-begin,
# prefix-constrained and sequence bias
def _scores(batch=3, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, vocab, generator=g) * 3
    scores[0, 5] = -float("inf")  # a masked token, as after an earlier processor
    return scores, torch.randint(0, vocab, (batch, 7), generator=g)


PROCESSORS = [
    ("TypicalLogitsWarper", dict(mass=0.6)),
    ("TypicalLogitsWarper", dict(mass=0.2, min_tokens_to_keep=4)),
    ("EpsilonLogitsWarper", dict(epsilon=0.03)),
    ("EpsilonLogitsWarper", dict(epsilon=0.5, min_tokens_to_keep=3, filter_value=-1e4)),
    ("EtaLogitsWarper", dict(epsilon=0.05)),
    ("EtaLogitsWarper", dict(epsilon=0.9, min_tokens_to_keep=2)),
    ("LogitNormalization", dict()),
    ("ForcedBOSTokenLogitsProcessor", dict(bos_token_id=3)),
    ("ForcedEOSTokenLogitsProcessor", dict(max_length=8, eos_token_id=[2, 9])),
    ("ExponentialDecayLengthPenalty", dict(exponential_decay_length_penalty=(2, 1.5), eos_token_id=[5, 7],
                                           input_ids_seq_length=3)),
    ("SuppressTokensAtBeginLogitsProcessor", dict(begin_suppress_tokens=[1, 4], begin_index=7)),
    ("PrefixConstrainedLogitsProcessor", dict(prefix_allowed_tokens_fn=lambda b, s: [b, int(s[-1]) % 40, 5],
                                              num_beams=1)),
    ("SequenceBiasLogitsProcessor", dict(sequence_bias=[[[4], 2.5], [[1, 2], -3.0], [[7, 8, 9], 1.0]])),
    ("SequenceBiasLogitsProcessor", dict(sequence_bias={(11,): -1.5, (3, 12): 4.0})),
]


@pytest.mark.parametrize("name,kwargs", PROCESSORS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(PROCESSORS)])
def test_logits_processors_match_transformers(name, kwargs):
    ours, theirs = getattr(hf_lite, name)(**kwargs), getattr(transformers, name)(**kwargs)
    assert list(inspect.signature(type(ours)).parameters) == list(inspect.signature(type(theirs)).parameters)
    for seed in range(4):
        scores, input_ids = _scores(seed=seed)
        if name == "SequenceBiasLogitsProcessor":  # make the prefixes occur
            input_ids[0, -2:] = torch.tensor([7, 8])
            input_ids[1, -1] = 1
            input_ids[2, -1] = 3
        for length in (1, 7):  # the forced / begin / decay processors act at one length only
            ids = input_ids[:, :length]
            if name == "ExponentialDecayLengthPenalty":
                ids = torch.cat([input_ids, input_ids], dim=1)
            expected = theirs(ids, scores.clone())
            got = ours(ids, scores.clone())
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert hf_lite.generation.__dict__[name] is type(ours)


def test_processors_from_hf_lite_steer_generate_as_in_transformers(tmp_path):
    ours = make_model("llama")
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    prompt = torch.tensor([[3, 17, 42, 8]])
    for lib, model in ((hf_lite, ours), (transformers, theirs)):
        processors = lib.LogitsProcessorList([lib.SequenceBiasLogitsProcessor([[[11], 5.0]]),
                                              lib.ExponentialDecayLengthPenalty((2, 2.0), 2, prompt.shape[1])])
        torch.manual_seed(0)
        out = model.generate(prompt, max_new_tokens=8, do_sample=True, logits_processor=processors,
                             pad_token_id=0)
        if lib is hf_lite:
            got = out
        else:
            expected = out
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name,bad,match", [
    ("TypicalLogitsWarper", dict(mass=1.5), "typical_p"),
    ("EpsilonLogitsWarper", dict(epsilon=0.0), "epsilon_cutoff"),
    ("EtaLogitsWarper", dict(epsilon=0.1, min_tokens_to_keep=0), "min_tokens_to_keep"),
    ("ForcedEOSTokenLogitsProcessor", dict(max_length=5, eos_token_id=-1), "eos_token_id"),
    ("SequenceBiasLogitsProcessor", dict(sequence_bias={(1,): 2}), "floats"),
    ("SequenceBiasLogitsProcessor", dict(sequence_bias=[]), "non-empty"),
])
def test_processor_argument_errors_as_transformers(name, bad, match):
    for lib in (hf_lite, transformers):
        with pytest.raises(ValueError, match=match):
            getattr(lib, name)(**bad)
