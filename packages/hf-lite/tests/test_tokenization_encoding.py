"""Encoding the way transformers 5 does, on both tokenizers against its TokenizersBackend over the same files: text
pairs and their truncation strategies, overflowing windows with a stride, special-token masks, lengths, tensor
types, ``pad()`` and the data collators that call it, ``model_max_length``, special tokens added at init,
``add_bos_token`` / ``add_eos_token``, and padding without a pad token.

Mirrors transformers' tests/test_tokenization_common.py (test_maximum_encoding_length_pair_input,
test_overflowing_tokens, test_special_tokens_mask_input_pairs, test_padding_to_max_length, test_right_and_left_padding,
test_padding_with_attention_mask, test_batch_encode_plus_padding ...) and tests/models/gpt2/test_tokenization_gpt2.py
(test_padding: no pad token raises).
"""

import json
import os

import numpy as np
import pytest
import torch
import transformers
from hf_lite import GPT2Tokenizer, PreTrainedTokenizerFast
from tokenizers import Tokenizer, processors

BOS, EOS = "<|im_start|>", "<|endoftext|>"
A, B = "hello world foo bar", "a pair here"
LONG = "def f(x):\n    return x * 2 + 1  # a comment that is long enough to overflow\n" * 2


@pytest.fixture(scope="module")
def pair_dir(trained_tokenizer_dir, tmp_path_factory):
    """A Llama-like template with a pair form: bos A eos B:1 eos:1."""
    tok = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}",
        pair=f"{BOS} $A {EOS} $B:1 {EOS}:1",
        special_tokens=[(BOS, tok.token_to_id(BOS)), (EOS, tok.token_to_id(EOS))],
    )
    directory = tmp_path_factory.mktemp("pair")
    tok.save(str(directory / "tokenizer.json"))
    return str(directory)


def _three(directory, **kw):
    """hf-lite's pure and fast tokenizers, and transformers', over the same tokenizer.json."""
    return (
        GPT2Tokenizer.from_pretrained(directory, **kw),
        PreTrainedTokenizerFast.from_pretrained(directory, **kw),
        transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"), **kw),
    )


def _same(calls, *tokenizers):
    for name, call in calls:
        results = [dict(call(t)) for t in tokenizers]
        expected = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in results[-1].items()}
        for got in results[:-1]:
            got = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in got.items()}
            assert got == expected, name


def test_pairs_and_truncation_strategies_match_transformers(pair_dir):
    kw = dict(pad_token="<pad>", bos_token=BOS, eos_token=EOS)
    pure, fast, theirs = _three(pair_dir, **kw)
    _same(
        [
            ("pair", lambda t: t(A, B, return_token_type_ids=True, return_special_tokens_mask=True)),
            ("batch of tuples", lambda t: t([(A, B), (B, A)], padding=True, return_token_type_ids=True)),
            ("text + text_pair lists", lambda t: t([A, B], [B, "x"], padding=True, padding_side="left")),
            ("longest_first", lambda t: t(LONG, A + " " + A, truncation=True, max_length=20)),
            ("longest_first both long", lambda t: t(LONG, LONG, truncation="longest_first", max_length=21)),
            ("only_first", lambda t: t(LONG, B, truncation="only_first", max_length=16)),
            ("only_second", lambda t: t(B, LONG, truncation="only_second", max_length=16)),
            ("max_length alone truncates", lambda t: t(LONG, max_length=10)),
            ("left truncation", lambda t: t([LONG], truncation=True, max_length=9)),
        ],
        pure,
        fast,
        theirs,
    )
    ids_a, ids_b = theirs.encode(A, add_special_tokens=False), theirs.encode(B, add_special_tokens=False)
    for t in (pure, fast):
        assert t.build_inputs_with_special_tokens(ids_a, ids_b) == theirs(A, B)["input_ids"]
        assert (
            t.get_special_tokens_mask(ids_a, ids_b)
            == theirs(A, B, return_special_tokens_mask=True)["special_tokens_mask"]
        )
        assert (
            t.create_token_type_ids_from_sequences(ids_a, ids_b)
            == theirs(A, B, return_token_type_ids=True)["token_type_ids"]
        )
        assert t.num_special_tokens_to_add(pair=True) == theirs.num_special_tokens_to_add(pair=True) == 3
        with_specials = t(A)["input_ids"]
        assert t.get_special_tokens_mask(
            with_specials, already_has_special_tokens=True
        ) == theirs.get_special_tokens_mask(with_specials, already_has_special_tokens=True)
    pure.truncation_side = fast.truncation_side = theirs.truncation_side = "left"
    _same([("left side", lambda t: t(LONG, A, truncation="only_first", max_length=40))], pure, fast, theirs)


def test_overflowing_tokens_with_stride_match_transformers(pair_dir):
    pure, fast, theirs = _three(pair_dir, pad_token="<pad>")
    _same(
        [
            ("single", lambda t: t(LONG, truncation=True, max_length=8, stride=2, return_overflowing_tokens=True)),
            (
                "batch, padded",
                lambda t: t(
                    [LONG, A],
                    truncation=True,
                    max_length=7,
                    stride=1,
                    padding=True,
                    return_overflowing_tokens=True,
                    return_length=True,
                ),
            ),
            (
                "question + context",
                lambda t: t(
                    [B, A],
                    [LONG, LONG[:30]],
                    truncation="only_second",
                    max_length=20,
                    stride=3,
                    return_overflowing_tokens=True,
                    padding="max_length",
                ),
            ),
            ("no overflow needed", lambda t: t(A, truncation=True, max_length=50, return_overflowing_tokens=True)),
        ],
        pure,
        fast,
        theirs,
    )
    pure.truncation_side = theirs.truncation_side = "left"
    _same(
        [("left windows", lambda t: t(LONG, truncation=True, max_length=8, stride=3, return_overflowing_tokens=True))],
        pure,
        theirs,
    )
    with pytest.raises(ValueError, match="stride=6 must be smaller"):
        pure(LONG, truncation=True, max_length=8, stride=6, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="only_first' or 'only_second"):
        pure(LONG, LONG, truncation=True, max_length=20, return_overflowing_tokens=True)


def test_lengths_masks_and_tensor_types_match_transformers(pair_dir):
    pure, fast, theirs = _three(pair_dir, pad_token="<pad>")
    _same(
        [
            ("length + mask", lambda t: t(A, return_length=True, return_special_tokens_mask=True)),
            ("batch length", lambda t: t([A, B], return_length=True, padding=True)),
            ("np", lambda t: t([A, B], padding=True, return_tensors="np")),
            ("pt one text", lambda t: t(A, return_tensors="pt", return_length=True)),
        ],
        pure,
        fast,
        theirs,
    )
    got = pure([A, B], padding=True, return_tensors="np")
    assert isinstance(got["input_ids"], np.ndarray) and got["input_ids"].dtype == np.int64
    assert isinstance(pure(A, return_tensors="pt")["input_ids"], torch.Tensor)
    assert isinstance(pure(A)["input_ids"], list)


def test_pad_and_the_collators_that_call_it_match_transformers(pair_dir):
    pure, fast, theirs = _three(pair_dir, pad_token="<pad>")
    features = [dict(theirs(x, return_special_tokens_mask=True)) for x in (A, B, LONG[:20])]
    labelled = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8], "labels": [8]}]
    _same(
        [
            ("list of dicts", lambda t: t.pad(features)),
            (
                "max_length + multiple, pt",
                lambda t: t.pad(
                    features, padding="max_length", max_length=13, pad_to_multiple_of=8, return_tensors="pt"
                ),
            ),
            ("dict of lists, left", lambda t: t.pad({"input_ids": [[1, 2, 3], [4]]}, padding_side="left")),
            ("labels pass through", lambda t: t.pad(labelled)),
            ("no attention mask", lambda t: t.pad({"input_ids": [[1, 2, 3], [4]]}, return_attention_mask=False)),
            ("one example", lambda t: t.pad({"input_ids": [1, 2, 3]}, padding="max_length", max_length=5)),
            ("token type ids", lambda t: t.pad({"input_ids": [[1, 2, 3], [4]], "token_type_ids": [[0, 1, 1], [0]]})),
            ("tensors in", lambda t: t.pad([{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([3])}])),
        ],
        pure,
        fast,
        theirs,
    )
    with pytest.raises(ValueError, match="Unable to create tensor"):
        pure.pad(labelled, return_tensors="pt")
    for collator in (transformers.DataCollatorWithPadding, transformers.DataCollatorForLanguageModeling):
        kw = {"mlm": False} if collator is transformers.DataCollatorForLanguageModeling else {}
        plain = [{"input_ids": f["input_ids"]} for f in features]
        ours_batch = collator(tokenizer=pure, **kw)(plain)
        theirs_batch = collator(tokenizer=theirs, **kw)(plain)
        assert set(ours_batch) == set(theirs_batch)
        for key in theirs_batch:
            assert torch.equal(ours_batch[key], theirs_batch[key]), (collator.__name__, key)


def test_model_max_length_comes_from_tokenizer_config_like_transformers(pair_dir, tmp_path):
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(pair_dir, "tokenizer.json"), pad_token="<pad>"
    )
    theirs.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["model_max_length"] = 9
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for cls in (GPT2Tokenizer, PreTrainedTokenizerFast):
        ours = cls.from_pretrained(tmp_path)
        assert ours.model_max_length == theirs.model_max_length == 9
        _same(
            [
                ("truncation=True", lambda t: t(LONG, truncation=True)),
                ("padding=max_length", lambda t: t([A, "x"], padding="max_length", truncation=True)),
            ],
            ours,
            theirs,
        )


def test_special_token_missing_from_the_vocabulary_is_added_like_transformers(pair_dir):
    pure, fast, theirs = _three(pair_dir, pad_token="[PAD]", additional_special_tokens=["<tool>"])
    assert len(pure) == len(fast) == len(theirs) and pure.pad_token_id == theirs.pad_token_id == len(theirs) - 2
    _same([("uses them", lambda t: t(["x [PAD] y<tool>", "z"], padding=True))], pure, fast, theirs)
    assert pure.decode(pure.encode("x<tool>"), skip_special_tokens=True) == "x"


@pytest.mark.parametrize(
    "flags",
    [
        dict(add_bos_token=True),
        dict(add_bos_token=False),
        dict(add_eos_token=True),
        dict(add_bos_token=True, add_eos_token=True),
    ],
    ids=str,
)
def test_add_bos_and_eos_token_rewrite_the_template_like_transformers(flags, pair_dir, tmp_path):
    pure, fast, theirs = _three(pair_dir, bos_token=BOS, eos_token=EOS, **flags)
    _same([("single", lambda t: t(A)), ("pair", lambda t: t(A, B, return_token_type_ids=True))], pure, fast, theirs)
    for ours in (pure, fast):
        ours.save_pretrained(tmp_path / type(ours).__name__)
        reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path / type(ours).__name__)
        _same([("saved", lambda t: t(A, B))], reloaded, theirs)


def test_padding_without_a_pad_token_raises_even_when_nothing_needs_padding(pair_dir):
    """Upstream test_padding: the error does not depend on the lengths."""
    for tokenizer in _three(pair_dir):
        for call in (
            lambda t: t.encode(A, max_length=15, padding="max_length"),
            lambda t: t(A, padding=True),
            lambda t: t([A, A], padding=True),
            lambda t: t(A, B, max_length=15, padding="max_length"),
            lambda t: t.pad({"input_ids": [[1], [2]]}),
        ):
            with pytest.raises(ValueError, match="does not have a padding token"):
                call(tokenizer)
