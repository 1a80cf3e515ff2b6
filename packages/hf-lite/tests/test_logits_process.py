"""Every logits processor against hand-computed expectations, and against transformers' own on random scores."""

import math

import pytest
import torch
import transformers.generation.logits_process as T
from hf_lite.generation import logits_process as L

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
        [0, 1], [0, 5], [1, 1], [1, 5]]
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
    ]


def test_every_processor_equals_transformers_on_random_scores():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, 12, (4, 20), generator=g)
        scores = torch.randn(4, 12, generator=g) * 3
        for ours, theirs in _transformers_pairs():
            torch.testing.assert_close(ours(ids, scores.clone()), theirs(ids, scores.clone()),
                                       msg=lambda m, o=ours: f"{type(o).__name__}: {m}")


def test_processor_list_applies_in_order():
    lst = L.LogitsProcessorList([L.TemperatureLogitsWarper(0.5), L.TopKLogitsWarper(1)])
    out = lst(None, torch.tensor([[1.0, 2.0]]))
    assert out.tolist() == [[INF, 4.0]]
    assert math.isinf(out[0, 0])
