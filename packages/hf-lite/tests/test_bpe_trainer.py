"""``train_bpe`` (pure Python) against the ``tokenizers`` library's ``BpeTrainer`` over a ``ByteLevel``
pre-tokenizer: the same corpus and settings give the same vocabulary (ids included) and the same merges, in order.

Mirrors tokenizers' tests of the BPE trainer (bindings/python/tests/bindings/test_trainers.py: vocab_size,
min_frequency, special_tokens, initial_alphabet) with the Rust trainer itself as the reference, and minbpe's
test that its trained tokenizer round-trips text.
"""

import json

import pytest
from hf_lite.byte_level_bpe import ByteLevelBPE, train_bpe
from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer
from hf_lite_testing import SPECIALS, stdlib_texts
from tokenizers import pre_tokenizers, trainers


@pytest.fixture(scope="module")
def texts():
    return stdlib_texts(4)


def _reference(texts, **settings):
    """vocab and merges of the Rust trainer on the same GPT-2 byte-level pipeline."""
    tok = byte_level_bpe_tokenizer()
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(show_progress=False, **settings))
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]], tok


SETTINGS = {
    "byte_alphabet_specials": dict(vocab_size=420, special_tokens=SPECIALS,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    "seen_alphabet_only": dict(vocab_size=300),
    "min_frequency_stops_early": dict(vocab_size=5000, min_frequency=40, special_tokens=["<pad>"]),
    "specials_in_corpus_order": dict(vocab_size=350, min_frequency=2, special_tokens=["<|endoftext|>", "def"]),
}


@pytest.mark.parametrize("case", list(SETTINGS))
def test_vocab_and_merges_equal_tokenizers_bpe_trainer(texts, case):
    settings = SETTINGS[case]
    vocab, merges, tok = _reference(texts, **settings)
    ours_vocab, ours_merges = train_bpe(texts, settings["vocab_size"], settings.get("min_frequency", 0),
                                        settings.get("special_tokens", ()), settings.get("initial_alphabet", ()))
    assert ours_merges == merges
    assert ours_vocab == vocab
    if case == "min_frequency_stops_early":
        assert len(vocab) < settings["vocab_size"], "sanity: min_frequency, not vocab_size, ended the training"
    else:
        assert len(vocab) == settings["vocab_size"]
    bpe = ByteLevelBPE(ours_vocab, ours_merges)
    sample = texts[0][:4000].replace("def", "fed")  # a special token in the text is the Rust tokenizer's one token
    assert bpe.encode(sample) == tok.encode(sample).ids
    assert bpe.decode(bpe.encode(sample)) == sample


def test_ties_go_to_the_pair_of_lowest_ids():
    """Every pair is seen once: the order of merges is the order of the pairs' ids, as in the Rust trainer."""
    texts = ["zy xw", "ba dc"]
    vocab, merges, _ = _reference(texts, vocab_size=30)
    assert train_bpe(texts, 30) == (vocab, merges)
    assert merges[:2] == [("b", "a"), ("d", "c")], "sanity: the corpus's first pair (z, y) is not the first merge"
