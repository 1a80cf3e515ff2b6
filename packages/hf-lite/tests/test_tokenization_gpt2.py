"""Pure-Python byte-level BPE == PreTrainedTokenizerFast == the `tokenizers` library, on a tokenizer.json trained
in the test on the stdlib's source; property-based over unicode text, whitespace runs, emoji and special tokens."""

import json
import os

import pytest
from hf_lite import GPT2Tokenizer, PreTrainedTokenizerFast
from hf_lite.tokenization_gpt2 import bytes_to_unicode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

SPECIAL_KW = dict(eos_token="<|endoftext|>", pad_token="<pad>")


@pytest.fixture(scope="module")
def trio(trained_tokenizer_dir):
    pure = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, **SPECIAL_KW)
    fast = PreTrainedTokenizerFast.from_pretrained(trained_tokenizer_dir, **SPECIAL_KW)
    rust = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
    return pure, fast, rust


def test_bytes_to_unicode_is_a_printable_bijection():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_corpus_text_identical_ids_and_round_trip(trio, corpus):
    pure, fast, rust = trio
    for text in corpus[-3:]:  # files the tokenizer was trained on
        chunk = text[:4000]
        ids = pure.encode(chunk)
        assert ids == fast.encode(chunk) == rust.encode(chunk).ids
        assert pure.decode(ids) == fast.decode(ids) == chunk
    assert len(ids) < len(chunk.encode()) / 2, "sanity: merges compress trained text"


pieces = st.one_of(
    st.text(max_size=12),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "    ", "\u3000"]),
    st.sampled_from(["😀", "👍🏽", "🇫🇷", "é", "ß", "漢字", "ﷺ", "\u200d", "'s", "'ll", "123", "def", " return"]),
    st.sampled_from(["<|endoftext|>", "<pad>", "<|im_start|>", "<|im_end|>"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(pieces, max_size=8).map("".join))
def test_pure_equals_fast_equals_tokenizers_for_any_text(trio, text):
    pure, fast, rust = trio
    ids = pure.encode(text)
    assert ids == fast.encode(text) == rust.encode(text).ids
    assert pure.decode(ids) == fast.decode(ids) == rust.decode(ids, skip_special_tokens=False) == text
    assert pure.decode(ids, skip_special_tokens=True) == fast.decode(ids, skip_special_tokens=True)
    assert pure.tokenize(text) == fast.tokenize(text)


def test_special_tokens_in_the_middle_are_never_split(trio):
    pure, fast, _ = trio
    eos, pad = pure.eos_token_id, pure.pad_token_id
    ids = pure.encode("ab<|endoftext|>cd<pad><pad>")
    assert ids.count(eos) == 1 and ids.count(pad) == 2
    assert ids == fast.encode("ab<|endoftext|>cd<pad><pad>")
    assert pure.decode(ids, skip_special_tokens=True) == "abcd"


def test_vocab_merges_files_and_tokenizer_json_give_the_same_tokenizer(trio, tmp_path):
    pure, fast, _ = trio
    pure.save_pretrained(tmp_path)
    assert {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json"} <= set(os.listdir(tmp_path))
    (tmp_path / "tokenizer.json").rename(tmp_path / "elsewhere.json")
    # the special tokens live in tokenizer.json's added_tokens; vocab.json/merges.txt + added_tokens.json carry them
    added = {t: i for i, t in pure.added_tokens_decoder.items()}
    (tmp_path / "added_tokens.json").write_text(json.dumps(added))
    from_files = GPT2Tokenizer.from_pretrained(tmp_path)
    text = "x = {'a': 1}<|endoftext|>  # comment\n"
    assert from_files.encode(text) == pure.encode(text) == fast.encode(text)
    assert from_files.eos_token == "<|endoftext|>" and from_files.pad_token == "<pad>"
    # the tokenizer.json written by the pure tokenizer loads in Rust with the same ids
    rust = Tokenizer.from_file(str(tmp_path / "elsewhere.json"))
    assert rust.encode(text).ids == pure.encode(text)


def test_template_post_processor_special_tokens(templated_tokenizer_dir):
    pure = GPT2Tokenizer.from_pretrained(templated_tokenizer_dir, pad_token="<pad>")
    fast = PreTrainedTokenizerFast.from_pretrained(templated_tokenizer_dir, pad_token="<pad>")
    rust = Tokenizer.from_file(os.path.join(templated_tokenizer_dir, "tokenizer.json"))
    text = "hello world"
    assert pure.encode(text) == fast.encode(text) == rust.encode(text).ids
    assert pure.encode(text)[0] == pure.convert_tokens_to_ids("<|im_start|>")
    assert pure.encode(text)[-1] == pure.convert_tokens_to_ids("<|endoftext|>")
    assert pure.encode(text, add_special_tokens=False) == rust.encode(text, add_special_tokens=False).ids
    assert pure.num_special_tokens_to_add() == 2


def test_unsupported_tokenizer_json_pipelines_raise_clear_errors(trained_tokenizer_dir, tmp_path):
    spec = json.loads(open(os.path.join(trained_tokenizer_dir, "tokenizer.json"), encoding="utf-8").read())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [spec["pre_tokenizer"]]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="pre_tokenizer 'Sequence' is not the GPT-2 ByteLevel one"):
        GPT2Tokenizer.from_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path).encode("a b") != []  # Rust handles any pipeline
    with pytest.raises(OSError, match="neither tokenizer.json nor vocab.json"):
        GPT2Tokenizer.from_pretrained(tmp_path / "missing")
