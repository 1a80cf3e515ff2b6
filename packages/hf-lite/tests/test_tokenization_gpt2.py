"""Pure-Python byte-level BPE == PreTrainedTokenizerFast == the `tokenizers` library, on a tokenizer.json trained
in the test on the stdlib's source; property-based over unicode text, whitespace runs, emoji and special tokens.

The second half ports transformers' tests/models/gpt2/test_tokenization_gpt2.py (its 21-token vocabulary, the
padding / bos / special-token-mask cases), and loads tokenizer.json files that transformers 5 saved.
"""

import json
import os

import pytest
import transformers
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
    assert {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(
        os.listdir(tmp_path)
    )
    (tmp_path / "tokenizer.json").rename(tmp_path / "elsewhere.json")
    # the special tokens live in tokenizer.json's added_tokens; vocab.json/merges.txt + added_tokens.json carry them
    added = pure.get_added_vocab()  # {content: id}, as added_tokens.json holds it
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
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, spec["pre_tokenizer"]]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match=r"pre_tokenizer \"Sequence of \['WhitespaceSplit', 'ByteLevel'\]\" is not"):
        GPT2Tokenizer.from_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path).encode("a b") != []  # Rust handles any pipeline
    with pytest.raises(OSError, match="neither tokenizer.json nor vocab.json"):
        GPT2Tokenizer.from_pretrained(tmp_path, subfolder="empty")
    with pytest.raises(OSError, match="missing' is not a local directory either"):  # nor a hub repo id
        GPT2Tokenizer.from_pretrained(tmp_path / "missing")
    spec = json.loads(open(os.path.join(trained_tokenizer_dir, "tokenizer.json"), encoding="utf-8").read())
    spec["model"]["unk_token"] = "<unk>"  # GPT2Tokenizer drops unknown bytes; a BPE unk token would map them
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="BPE unk_token='<unk>' is not supported by GPT2Tokenizer"):
        GPT2Tokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------- ports of transformers' test_tokenization_gpt2.py
# Adapted from Sennrich et al. 2015, as upstream: a 21-token vocabulary where "lower newer" needs the merges.
UPSTREAM_VOCAB = [
    "l",
    "o",
    "w",
    "e",
    "r",
    "s",
    "t",
    "i",
    "d",
    "n",
    "\u0120",
    "\u0120l",
    "\u0120n",
    "\u0120lo",
    "\u0120low",
    "er",
    "\u0120lowest",
    "\u0120newer",
    "\u0120wider",
    "<unk>",
    "<|endoftext|>",
]
UPSTREAM_MERGES = ["#version: 0.2", "\u0120 l", "\u0120l o", "\u0120lo w", "e r", ""]


@pytest.fixture
def upstream_dir(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(dict(zip(UPSTREAM_VOCAB, range(len(UPSTREAM_VOCAB))))))
    (tmp_path / "merges.txt").write_text("\n".join(UPSTREAM_MERGES))
    return tmp_path


def test_full_tokenizer(upstream_dir):
    tokenizer = GPT2Tokenizer(upstream_dir / "vocab.json", upstream_dir / "merges.txt", unk_token="<unk>")
    tokens = tokenizer.tokenize("lower newer", add_prefix_space=True)
    assert tokens == ["\u0120low", "er", "\u0120", "n", "e", "w", "er"]
    assert tokenizer.convert_tokens_to_ids(tokens + [tokenizer.unk_token]) == [14, 15, 10, 9, 3, 2, 15, 19]
    assert tokenizer.tokenize("lower newer") == ["l", "o", "w", "er", "\u0120", "n", "e", "w", "er"]


def test_rust_and_python_full_tokenizers(upstream_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = GPT2Tokenizer.from_pretrained(upstream_dir, unk_token="<unk>")
    vocab = dict(zip(UPSTREAM_VOCAB, range(len(UPSTREAM_VOCAB))))
    rust = Tokenizer(models.BPE(vocab, [tuple(m.split()) for m in UPSTREAM_MERGES[1:-1]]))
    rust.pre_tokenizer, rust.decoder = pre_tokenizers.ByteLevel(add_prefix_space=True), decoders.ByteLevel()
    rust_tokenizer = PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="<unk>")
    theirs = transformers.GPT2Tokenizer(
        vocab=vocab, merges=[tuple(m.split()) for m in UPSTREAM_MERGES[1:-1]], add_prefix_space=True, unk_token="<unk>"
    )
    sequence = "lower newer"
    tokens = tokenizer.tokenize(sequence, add_prefix_space=True)
    assert tokens == rust_tokenizer.tokenize(sequence) == theirs.tokenize(sequence)
    ids = tokenizer.encode(sequence, add_special_tokens=False, add_prefix_space=True)
    assert ids == rust_tokenizer.encode(sequence, add_special_tokens=False) == theirs.encode(sequence)
    # and the other way round: the fast one without its prefix space for one call
    assert rust_tokenizer.tokenize(sequence, add_prefix_space=False) == tokenizer.tokenize(sequence)
    assert rust_tokenizer.convert_tokens_to_ids(tokens + ["<unk>"]) == [14, 15, 10, 9, 3, 2, 15, 19]


def test_padding_if_pad_token_set_slow(trained_tokenizer_dir):
    tokenizer = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")
    s = "This is a simple input"
    s2 = ["This is a simple input looooooooong", "This is a simple input"]
    p = ("This is a simple input", "This is a pair")
    p2 = [
        ("This is a simple input loooooong", "This is a simple input"),
        ("This is a simple pair loooooong", "This is a simple pair"),
    ]
    pad = tokenizer.pad_token_id
    out_s = tokenizer(s, padding="max_length", max_length=30, return_tensors="np")
    out_s2 = tokenizer(s2, padding=True, truncation=True, return_tensors="np")
    out_p = tokenizer(*p, padding="max_length", max_length=60, return_tensors="np")
    out_p2 = tokenizer(p2, padding=True, truncation=True, return_tensors="np")
    assert out_s["input_ids"].shape == (1, 30) and pad in out_s["input_ids"] and 0 in out_s["attention_mask"]
    longest = len(tokenizer.encode(s2[0]))
    assert out_s2["input_ids"].shape[-1] == longest
    assert pad not in out_s2["input_ids"][0] and 0 not in out_s2["attention_mask"][0]
    assert pad in out_s2["input_ids"][1] and 0 in out_s2["attention_mask"][1]
    assert out_p["input_ids"].shape[-1] == 60 and pad in out_p["input_ids"] and 0 in out_p["attention_mask"]
    lengths = [len(tokenizer.encode(*pair)) for pair in p2]
    long, short = (0, 1) if lengths[0] > lengths[1] else (1, 0)
    assert out_p2["input_ids"].shape[-1] == lengths[long]
    assert pad not in out_p2["input_ids"][long] and pad in out_p2["input_ids"][short]
    with pytest.raises(TypeError, match="truncate"):  # upstream's own typo, silently ignored by transformers
        tokenizer(s2, padding=True, truncate=True)


def test_add_bos_token_slow(upstream_dir):
    bos_token = "$$$"  # not in the vocabulary: added, as transformers does with a special token it is given
    tokenizer = GPT2Tokenizer.from_pretrained(upstream_dir, bos_token=bos_token, add_bos_token=True)
    assert tokenizer.bos_token_id == len(UPSTREAM_VOCAB)
    out_s = tokenizer("lower newer")
    out_s2 = tokenizer(["lower newer", "newer lower"])
    assert out_s.input_ids[0] == tokenizer.bos_token_id
    assert all(o[0] == tokenizer.bos_token_id for o in out_s2.input_ids)
    assert tokenizer.decode(out_s.input_ids).startswith(bos_token)
    assert all(d.startswith(bos_token) for d in tokenizer.batch_decode(out_s2.input_ids))


def test_upstream_vocab_defaults_unk_bos_eos_to_endoftext_as_transformers(upstream_dir):
    """transformers' GPT2Tokenizer defaults unk, bos and eos to <|endoftext|>: its padding and add_bos_token tests
    on the 21-token vocabulary ("This is ..." has no 'T') need the unk default."""
    files = (upstream_dir / "vocab.json", upstream_dir / "merges.txt")
    texts = ["lower newer", "newer lower low", "low"]
    for kw, call in ((dict(add_bos_token=True), {}), (dict(pad_token="<|endoftext|>"), dict(padding=True))):
        ours = GPT2Tokenizer(*files, **kw)
        theirs = transformers.GPT2Tokenizer(*map(str, files), **kw)
        assert ours(texts, **call)["input_ids"] == theirs(texts, **call)["input_ids"], kw
        assert (ours.unk_token, ours.bos_token, ours.eos_token) == ("<|endoftext|>",) * 3
        # characters outside this vocabulary ('T', 'h', ...) are dropped, as transformers 5's Rust BPE (built
        # without an unk token) drops them; a token looked up by name still maps to unk_token
        sentences = ["This is a simple input", "This is a simple input looooooooong", "This is T"]
        assert ours(sentences, **call)["input_ids"] == theirs(sentences, **call)["input_ids"], kw
        assert ours.tokenize("This is T") == theirs.tokenize("This is T") == ["i", "s", "\u0120", "i", "s", "\u0120"]
        assert ours.convert_tokens_to_ids(["T", "l"]) == theirs.convert_tokens_to_ids(["T", "l"]) == [20, 0]


def test_special_tokens_mask_input_pairs_and_bos_token(upstream_dir):
    tokenizer = GPT2Tokenizer.from_pretrained(upstream_dir, bos_token="<|endoftext|>", add_bos_token=True)
    sequence_0, sequence_1 = "lower newer", "newer lower"
    encoded = tokenizer.encode(sequence_0, add_special_tokens=False) + tokenizer.encode(
        sequence_1, add_special_tokens=False
    )
    enc = tokenizer(sequence_0, sequence_1, add_special_tokens=True, return_special_tokens_mask=True)
    assert len(enc["special_tokens_mask"]) == len(enc["input_ids"]) and sum(enc["special_tokens_mask"]) == 2
    assert [x for x, m in zip(enc["input_ids"], enc["special_tokens_mask"]) if not m] == encoded


# ---------------------------------------------------------------- tokenizer.json written by transformers 5
def _llama3_style_tokenizer(corpus) -> Tokenizer:
    """A byte-level BPE as Llama 3 ships: Split(regex) + ByteLevel(use_regex=False), ignore_merges, bos template."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers

    pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus[:8], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
    )
    return tok


@pytest.mark.parametrize("kind", ["gpt2_byte_level", "llama3_split"])
def test_pure_tokenizer_reads_a_tokenizer_json_saved_by_transformers(kind, trained_tokenizer_dir, corpus, tmp_path):
    """transformers 5 saves a tokenizers-trained BPE as tokenizer.json + a config naming TokenizersBackend."""
    from hf_lite import AutoTokenizer, PreTrainedTokenizer

    rust = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
    if kind == "llama3_split":
        rust = _llama3_style_tokenizer(corpus)
    transformers.PreTrainedTokenizerFast(tokenizer_object=rust).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    pure = AutoTokenizer.from_pretrained(tmp_path, use_fast=False)
    assert type(pure) is GPT2Tokenizer and type(PreTrainedTokenizer.from_pretrained(tmp_path)) is GPT2Tokenizer
    fast = AutoTokenizer.from_pretrained(tmp_path)
    assert type(fast) is PreTrainedTokenizerFast
    texts = [corpus[-1][:3000], "Hello WORLD it's 12345 ,; 😀 漢字\r\n\n  x", "a 'LL b"]
    for text in texts:
        assert pure(text)["input_ids"] == fast(text)["input_ids"] == theirs(text)["input_ids"], text[:40]
        assert pure.decode(pure.encode(text)) == theirs.decode(theirs.encode(text))
    assert pure("a", "b")["input_ids"] == theirs("a", "b")["input_ids"]
    # and what the pure tokenizer writes is read back by transformers the same way
    pure.save_pretrained(tmp_path / "again")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "again")
    assert all(again(t)["input_ids"] == theirs(t)["input_ids"] for t in texts)
