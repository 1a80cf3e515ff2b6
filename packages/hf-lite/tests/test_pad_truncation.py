"""transformers' ``docs/source/en/pad_truncation.md``: every instruction of its table, on batches of texts and of
text pairs (``truncation=True`` replaced by each ``STRATEGY``), with and without a ``model_max_length``, at the
page's ``max_length=42`` and at one that truncates. hf-lite's two tokenizers against transformers 5's over the same
files: the same ids and attention masks, the same warnings where transformers warns (Python warnings and the
library's logger), the same error where it raises.

Mirrors transformers' ``_get_padding_truncation_strategies`` cases in tests/test_tokenization_common.py
(test_padding_to_max_length, test_padding_to_multiple_of, test_maximum_encoding_length_*).
"""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest
import transformers
from hf_lite import GPT2Tokenizer, PreTrainedTokenizerFast
from tokenizers import Tokenizer, processors

# the page's batch (its preprocessing guide's batch_sentences), and pairs for the STRATEGY rows
BATCH = ["But what about second breakfast?", "Don't think he knows about second breakfast, Pip.",
         "What about elevensies?"]
PAIRS = [("But what about second breakfast?", "Don't think he knows about second breakfast, Pip."),
         ("What about elevensies?", "Hobbits eat seven meals a day.")]
STRATEGIES = [True, "longest_first", "only_first", "only_second"]

# (row of the table, the instruction's keyword arguments), in the page's order; "MAXLEN" is the specific length
TABLE = [
    ("no truncation, no padding", {}),
    ("no truncation, padding to max sequence in batch", {"padding": True}),
    ("no truncation, padding to max sequence in batch", {"padding": "longest"}),
    ("no truncation, padding to max model input length", {"padding": "max_length"}),
    ("no truncation, padding to specific length", {"padding": "max_length", "max_length": "MAXLEN"}),
    ("no truncation, padding to a multiple of a value", {"padding": True, "pad_to_multiple_of": 8}),
    ("truncation to max model input length, no padding", {"truncation": "STRATEGY"}),
    ("truncation to max model input length, padding to max sequence in batch",
     {"padding": True, "truncation": "STRATEGY"}),
    ("truncation to max model input length, padding to max model input length",
     {"padding": "max_length", "truncation": "STRATEGY"}),
    ("truncation to specific length, no padding", {"truncation": "STRATEGY", "max_length": "MAXLEN"}),
    ("truncation to specific length, padding to max sequence in batch",
     {"padding": True, "truncation": "STRATEGY", "max_length": "MAXLEN"}),
    ("truncation to specific length, padding to specific length",
     {"padding": "max_length", "truncation": "STRATEGY", "max_length": "MAXLEN"}),
    # what the table's "Not possible" cells and the text around it point at: max_length with padding=True and no
    # truncation (transformers warns), and pad_to_multiple_of with a truncation length that is not a multiple of it
    ("max_length ignored by padding=True", {"padding": True, "max_length": "MAXLEN"}),
    ("truncation length not a multiple of pad_to_multiple_of",
     {"padding": "max_length", "truncation": True, "max_length": "MAXLEN", "pad_to_multiple_of": 8}),
]


def _cases():
    for row, kwargs in TABLE:
        for inputs in ("batch", "pairs"):
            strategies = STRATEGIES if "STRATEGY" in kwargs.values() and inputs == "pairs" else [True]
            lengths = [42, 7] if "MAXLEN" in kwargs.values() else [None]
            for strategy in strategies:
                for max_length in lengths:
                    call = {k: strategy if v == "STRATEGY" else max_length if v == "MAXLEN" else v
                            for k, v in kwargs.items()}
                    yield pytest.param(inputs, call, id=f"{row} | {inputs} | {call}")


@pytest.fixture(scope="module", params=[(None, False), (12, False), (12, True)],
                ids=["no-model_max_length", "model_max_length=12", "model_max_length=12-bos-eos-template"])
def checkpoint(request, trained_tokenizer_dir, tmp_path_factory):
    """A tokenizer directory transformers wrote (with a pad token), with or without a model_max_length, and with a
    Llama-like template adding special tokens around each sequence (truncation leaves room for them)."""
    model_max_length, templated = request.param
    directory = tmp_path_factory.mktemp("pad_truncation")
    source = trained_tokenizer_dir
    if templated:
        tok = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
        bos, eos = "<|im_start|>", "<|endoftext|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1",
            special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))])
        source = str(directory / "source")
        os.makedirs(source)
        tok.save(os.path.join(source, "tokenizer.json"))
    transformers.AutoTokenizer.from_pretrained(source, pad_token="<pad>").save_pretrained(directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("model_max_length", None)
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    config_file.write_text(json.dumps(config))
    return str(directory)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _run(tokenizer, logger_name: str, texts, kwargs):
    """(ids, masks) or the error raised, and the warnings and log records (WARNING and up) emitted."""
    handler, logger = _Records(), logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = tokenizer(texts, **kwargs)
                result = (out["input_ids"], out["attention_mask"])
            except Exception as err:  # compared by type and text
                result = err
    finally:
        logger.removeHandler(handler)
    messages = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    return result, sorted(messages + handler.messages)


@pytest.mark.parametrize("ours_class", [PreTrainedTokenizerFast, GPT2Tokenizer])
@pytest.mark.parametrize("inputs, kwargs", list(_cases()))
def test_pad_truncation_table_matches_transformers(ours_class, inputs, kwargs, checkpoint):
    texts = BATCH if inputs == "batch" else PAIRS
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoint)
    ours = ours_class.from_pretrained(checkpoint)
    assert ours.model_max_length == theirs.model_max_length
    expected, their_warnings = _run(theirs, "transformers", texts, kwargs)
    got, our_warnings = _run(ours, "hf_lite", texts, kwargs)
    if isinstance(expected, Exception):  # transformers 5 passes on the Rust library's plain Exception
        assert isinstance(got, type(expected)) and str(got) == str(expected), got
    else:
        assert got == expected
    assert our_warnings == their_warnings


def test_the_cases_cover_every_row_and_can_differ(checkpoint):
    """Every row of the page's table is walked, and the comparison sees a difference when there is one."""
    assert len({row for row, _ in TABLE}) == 13 and len(list(_cases())) > 40
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoint)
    longest, _ = _run(theirs, "transformers", BATCH, {"padding": True})
    to_42, _ = _run(theirs, "transformers", BATCH, {"padding": "max_length", "max_length": 42})
    assert longest != to_42
