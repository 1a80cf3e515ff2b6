"""Stopping criteria: max length, max new tokens, EOS (several ids), stop strings, max time.

Mirrors transformers' tests/generation/test_stopping_criteria.py, with the test-trained byte-level BPE (pure and
fast) in place of the hub's gpt2 / Qwen2 tokenizers.
"""

import json
import os
import time

import pytest
import torch
from hf_lite import GPT2Tokenizer, PreTrainedTokenizerFast
from hf_lite.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxNewTokensCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)


def _tensors(length, batch=3, vocab=250):
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(length))
    return ids, torch.ones((batch, length)) / length


@pytest.fixture(scope="module", params=["pure", "fast"])
def tok(request, trained_tokenizer_dir):
    cls = GPT2Tokenizer if request.param == "pure" else PreTrainedTokenizerFast
    return cls.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")


@pytest.fixture(scope="module")
def plain_tok(trained_tokenizer_dir, tmp_path_factory):
    """The same BPE where <|im_start|> / <|im_end|> are not added tokens (as for the hub's gpt2 in upstream)."""
    spec = json.load(open(os.path.join(trained_tokenizer_dir, "tokenizer.json"), encoding="utf-8"))
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in ("<|im_start|>", "<|im_end|>")]
    directory = tmp_path_factory.mktemp("plain")
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return GPT2Tokenizer.from_pretrained(directory, pad_token="<pad>")


def test_list_criteria():
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=10), MaxTimeCriteria(max_time=0.1)])
    assert not all(criteria(*_tensors(5))) and not all(criteria(*_tensors(9)))
    assert all(criteria(*_tensors(10)))
    assert criteria.max_length == 10


def test_max_length_and_max_new_tokens():
    ids = torch.zeros(2, 5, dtype=torch.long)
    assert MaxLengthCriteria(5)(ids).tolist() == [True, True]
    assert MaxLengthCriteria(6)(ids).tolist() == [False, False]
    assert MaxNewTokensCriteria(3, 2)(ids).tolist() == [True, True]
    assert MaxNewTokensCriteria(3, 3)(ids).tolist() == [False, False]
    with pytest.raises(ValueError, match="max_length"):
        MaxLengthCriteria(0)


def test_max_time_criteria():
    ids, scores = _tensors(5)
    assert not all(MaxTimeCriteria(max_time=0.1)(ids, scores))
    assert all(MaxTimeCriteria(max_time=0.1, initial_timestamp=time.time() - 0.2)(ids, scores))


def test_eos_token_criteria():
    criteria = EosTokenCriteria(eos_token_id=0)
    ids, scores = _tensors(5)
    ids[:, -1] = 0
    assert all(criteria(ids, scores))
    ids[2, -1] = 1
    assert criteria(ids, scores).tolist() == [True, True, False]
    ids[:, -1] = 1
    assert criteria(ids, scores).tolist() == [False, False, False]
    several = torch.tensor([[1, 7], [1, 9], [7, 1]])
    assert EosTokenCriteria([7, 9])(several).tolist() == [True, True, False]


TRUE_STRINGS = ["<|im_start|><|im_end|>", "<|im_start|><|im_end|<|im_end|>", ">><|im_start|>>stop", "stop", "e nd"]
FALSE_STRINGS = [
    "<|im_start|><|im_end|",
    "<|im_start|><|im_end|<|im_end|",
    "<|im_end|><|im_start|>",
    "<|im_end|<>stop<|im_end|",
    "end",
    "en d",
    "eNd",
    "<|im_end|",
    "|im_end|>",
    "s",
]


@pytest.mark.parametrize("kind", ["added_special_tokens", "plain_vocabulary"])
def test_stop_string_criteria(kind, tok, plain_tok):
    tokenizer = tok if kind == "added_special_tokens" else plain_tok
    criteria = StopStringCriteria(tokenizer=tokenizer, stop_strings=["<|im_end|>", "stop", "e nd"])
    for strings, expected in ((TRUE_STRINGS, True), (FALSE_STRINGS, False)):
        batch = tokenizer(
            strings, return_tensors="pt", padding="longest", padding_side="left", add_special_tokens=False
        )["input_ids"]
        for i, text in enumerate(strings):
            assert bool(criteria(batch[i : i + 1])[0]) is expected, text


def test_stop_string_criteria_byte_fragments(tok):
    """A Hangul syllable is three byte tokens here; the stop string ends in the last of them."""
    ids = tok("대화 끝", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[-1:]) == "\ufffd" and tok.decode(ids[-3:]) == "끝", "sanity: split over byte tokens"
    for text, stop, expected in [("대화 끝", "끝", True), ("작업 완료", "완료", True), ("대화 끝 다음", "끝", False)]:
        row = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert bool(StopStringCriteria(tok, [stop])(row)[0]) is expected, text


def test_stop_string_criteria_vocab_size_mismatch(tok):
    """Ids past len(tokenizer) (a padded model vocabulary) decode to nothing instead of raising."""
    ids = torch.tensor([[len(tok) + 1024, 1, 2]])
    assert not StopStringCriteria(tokenizer=tok, stop_strings=["test"])(ids)[0]


def test_single_letter_stop_string(tok):
    # "ab" is one token here (upstream's gpt2 has "abc"); in "abbbbbbb" the "a" is not in the last token
    assert tok.tokenize("ab") == ["ab"] and len(tok.tokenize("abbbbbbb")) > 1, "sanity: the tokenization assumed"
    criteria = StopStringCriteria(tokenizer=tok, stop_strings=["a"])
    for strings, expected in ((["a", "baa", "ab"], True), (["abbbbbbb", "b"], False)):
        for text in strings:
            assert bool(criteria(torch.tensor([tok.encode(text, add_special_tokens=False)]))[0]) is expected, text


def test_criteria_per_row_batched(tok):
    text = [
        "They completed the challenging puzzle, revealing the hidden image at the end",
        "Today a dragon flew over France",
        "The aroma of freshly baked pizza filled the kitchen",
    ]
    inputs = tok(text, return_tensors="pt", padding="longest", padding_side="left", add_special_tokens=False)
    criteria = StoppingCriteriaList(
        [MaxLengthCriteria(max_length=50), StopStringCriteria(tokenizer=tok, stop_strings=["end"])]
    )
    assert criteria(inputs["input_ids"]).tolist() == [True, False, False]
    assert criteria(inputs["input_ids"][:, :-1]).tolist() == [False, False, False]


class _CharTokenizer:
    """One character per id (id = ord): the criterion needs nothing but ``decode``."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_stop_strings_stop_when_the_string_ends_in_the_newest_token():
    crit = StopStringCriteria(_CharTokenizer(), ["stop", "\n\n"])
    rows = [list(map(ord, s)) for s in ["I will stop", "I will sto", "stop then go", "a\n\n"]]
    width = max(map(len, rows))
    ids = torch.tensor([[32] * (width - len(r)) + r for r in rows])
    assert crit(ids).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="stop_strings"):
        StopStringCriteria(_CharTokenizer(), [""])
