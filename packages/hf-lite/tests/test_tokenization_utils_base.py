"""The shared interface on both tokenizers: padding, truncation, masks, tensors, special tokens, errors, saving,
chat templates, training; and the files load in transformers with the same ids.

Mirrors transformers' tests/test_tokenization_common.py (TokenizerTesterMixin: padding, truncation, pairs,
overflowing tokens, special-token masks, pad()) with parity checks against transformers 5's TokenizersBackend.
"""

import pytest
import torch
import transformers
from hf_lite import AutoTokenizer, GPT2Tokenizer, PreTrainedTokenizerFast

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module", params=["pure", "fast"])
def tok(request, templated_tokenizer_dir):
    cls = GPT2Tokenizer if request.param == "pure" else PreTrainedTokenizerFast
    return cls.from_pretrained(
        templated_tokenizer_dir,
        pad_token="<pad>",
        eos_token="<|endoftext|>",
        bos_token="<|im_start|>",
        chat_template=CHAT,
    )


def test_padding_longest_and_max_length_both_sides(tok):
    texts = ["short", "a somewhat longer sentence here"]
    enc = tok(texts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert ids.shape == mask.shape and ids.dtype == torch.long
    n = len(tok.encode("short"))
    assert mask[0].tolist() == [1] * n + [0] * (ids.shape[1] - n)
    assert (ids[0, n:] == tok.pad_token_id).all()
    left = tok(texts, padding="longest", padding_side="left", return_tensors="pt")
    assert left["attention_mask"][0].tolist() == [0] * (ids.shape[1] - n) + [1] * n
    assert left["input_ids"][0, -n:].tolist() == ids[0, :n].tolist()
    fixed = tok(texts, padding="max_length", max_length=40)
    assert [len(x) for x in fixed["input_ids"]] == [40, 40]
    multiple = tok(texts, padding=True, pad_to_multiple_of=8)
    assert len(multiple["input_ids"][0]) % 8 == 0


def test_truncation_keeps_special_tokens(tok):
    text = "one two three four five six seven eight nine ten"
    ids = tok(text, truncation=True, max_length=5)["input_ids"]
    full = tok.encode(text)
    assert len(ids) == 5 and ids[0] == full[0] and ids[-1] == full[-1] and ids[1:4] == full[1:4]
    tok.truncation_side = "left"
    try:
        assert tok(text, truncation=True, max_length=5)["input_ids"][1:4] == full[-4:-1]
    finally:
        tok.truncation_side = "right"
    assert tok(text, truncation=True, max_length=2)["input_ids"] == [full[0], full[-1]]


def test_bad_inputs_raise_clear_errors(tok, templated_tokenizer_dir):
    with pytest.raises(ValueError, match="below the 2 special tokens"):
        tok("some text", truncation=True, max_length=1)
    with pytest.raises(ValueError, match="Unable to create tensor"):
        tok(["a", "a b c d"], return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors='tf'"):
        tok(["a"], return_tensors="tf")
    with pytest.raises(ValueError, match="not a special token attribute"):
        tok.add_special_tokens({"banana_token": "<b>"})
    with pytest.raises(ValueError, match="padding="):
        tok(["a"], padding="sometimes")
    with pytest.raises(ValueError, match="not a non-negative int"):
        tok.decode([-1])
    # transformers silently drops unknown keywords; here each names itself
    with pytest.raises(TypeError, match="bogus"):
        tok("a", bogus=True)
    with pytest.raises(TypeError, match="bogus"):
        tok.encode("a", bogus=True)
    with pytest.raises(TypeError, match="bogus"):
        tok.tokenize("a", bogus=True)
    with pytest.raises(TypeError, match="bogus"):
        tok.pad({"input_ids": [[1]]}, bogus=True)
    with pytest.raises(ValueError, match=r"does not take \['bogus'\]"):
        type(tok).from_pretrained(templated_tokenizer_dir, bogus=True)
    with pytest.raises(ValueError, match="text_pair"):
        tok(["a", "b"], "c")
    with pytest.raises(ValueError, match="Truncation error: Second sequence not provided"):
        tok("a b c d e f", truncation="only_second", max_length=4)


def test_added_tokens_and_new_special_tokens(templated_tokenizer_dir):
    for cls in (GPT2Tokenizer, PreTrainedTokenizerFast):
        tok = cls.from_pretrained(templated_tokenizer_dir)
        n = len(tok)
        assert tok.add_tokens(["<tool>", "hello world"]) == 2
        assert tok.add_special_tokens({"pad_token": "[PAD]"}) == 1
        assert len(tok) == n + 3 and tok.pad_token_id == n + 2
        ids = tok.encode("say hello world<tool>[PAD]", add_special_tokens=False)
        assert ids[-3:] == [n + 1, n, n + 2]
        assert tok.decode(ids, skip_special_tokens=True) == "say hello world<tool>"


def test_batch_decode_and_return_attention_mask_false(tok):
    enc = tok(["first one", "second"], padding=True, return_tensors="pt", return_attention_mask=False)
    assert set(enc.keys()) == {"input_ids"}
    texts = tok.batch_decode(enc["input_ids"], skip_special_tokens=True)
    assert texts == ["first one", "second"]


def test_save_pretrained_files_reload_in_hf_lite_and_transformers(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    again = AutoTokenizer.from_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "print('hi')<|endoftext|>\n  x"
    assert again.encode(text) == tok.encode(text) == theirs(text)["input_ids"]
    assert again.pad_token == theirs.pad_token == "<pad>"
    assert again.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == theirs.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )


def test_apply_chat_template_matches_transformers(tok, tmp_path):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    tok.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert text == theirs.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    enc = tok.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
    ref = theirs.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], ref["input_ids"])
    batch = tok.apply_chat_template([conv, conv[:1]], padding=True, return_dict=True)
    assert len(batch["input_ids"]) == 2 and sum(batch["attention_mask"][1]) < len(batch["attention_mask"][1])
    with pytest.raises(ValueError, match="boom"):
        tok.apply_chat_template(conv, chat_template="{{ raise_exception('boom') }}")


def test_train_new_from_iterator(corpus, trained_tokenizer_dir):
    base = PreTrainedTokenizerFast.from_pretrained(trained_tokenizer_dir, eos_token="<|endoftext|>")
    new = base.train_new_from_iterator(corpus[:10], vocab_size=400, new_special_tokens=["<|new|>"])
    assert 390 <= len(new) <= 401
    assert new.eos_token == "<|endoftext|>" and new.convert_tokens_to_ids("<|new|>") is not None
    text = corpus[0][:2000]
    assert new.decode(new.encode(text)) == text
    # the retrained tokenizer still agrees with the pure-Python one on its own files
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        new.save_pretrained(d)
        pure = GPT2Tokenizer.from_pretrained(d)
        assert pure.encode(text + "<|new|>") == new.encode(text + "<|new|>")
    assert len(new.encode(text)) > len(base.encode(text)), "sanity: a smaller vocab needs more tokens"


def test_ids_past_the_tokenizer_decode_to_nothing_like_transformers(tok, tmp_path):
    """Model vocabularies are often padded past len(tokenizer); those ids must not crash decoding."""
    tok.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = tok.encode("hello world", add_special_tokens=False)
    padded = [ids[0], len(tok) + 5, *ids[1:], len(tok)]
    assert tok.decode(padded) == tok.decode(ids) == theirs.decode(padded) == "hello world"
    assert tok.batch_decode([padded, [len(tok) + 1]]) == theirs.batch_decode([padded, [len(tok) + 1]])
    assert tok.convert_ids_to_tokens([len(tok) + 5]) == theirs.convert_ids_to_tokens([len(tok) + 5]) == [None]
