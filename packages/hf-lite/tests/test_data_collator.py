"""Data collators and corpus grouping, against transformers' collators on the same tokenizer files.

Mirrors transformers' tests/trainer/test_data_collator.py (DataCollatorIntegrationTest: test_default_with_dict,
test_default_classification_and_regression, test_default_with_no_labels, test_data_collator_with_padding,
test_data_collator_for_language_modeling with mlm=False) and examples/pytorch/language-modeling/run_clm.py's
group_texts."""

import pytest
import torch
import transformers
from hf_lite import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    GroupedTextsDataset,
    IterableGroupedTextsDataset,
    default_data_collator,
    group_texts,
)
from hf_lite_testing import stdlib_texts


@pytest.fixture(scope="module")
def tokenizers(trained_tokenizer_dir):
    ours = AutoTokenizer.from_pretrained(trained_tokenizer_dir)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{trained_tokenizer_dir}/tokenizer.json")
    for tok in (ours, theirs):
        tok.pad_token = "<pad>"
    return ours, theirs


def _same(a: dict, b: dict):
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


@pytest.mark.parametrize(
    "features",
    [
        [{"label": i, "inputs": [0, 1, 2, 3, 4, 5]} for i in range(8)],
        [{"label": float(i), "inputs": [0, 1, 2]} for i in range(4)],
        [{"label_ids": [0, 1, 2], "inputs": [0, 1, 2, 3, 4, 5]} for _ in range(8)],
        [{"label": None, "inputs": [0, 1, 2, 3, 4, 5], "name": "x"} for _ in range(8)],
        [{"input_ids": torch.arange(5), "labels": torch.arange(5)} for _ in range(3)],
    ],
    ids=["int-label", "float-label", "label-ids", "no-label-and-strings", "tensors"],
)
def test_default_data_collator_matches_transformers(features):
    _same(default_data_collator(features), transformers.default_data_collator(features))


def test_default_data_collator_refuses_ragged_examples():
    with pytest.raises(ValueError, match="cannot stack 'input_ids'"):
        default_data_collator([{"input_ids": [1, 2]}, {"input_ids": [1]}])


@pytest.mark.parametrize("kw", [dict(), dict(padding="max_length", max_length=10), dict(pad_to_multiple_of=8)])
def test_padding_collator_matches_transformers(tokenizers, kw):
    ours, theirs = tokenizers
    texts = ["import os", "def f(x):\n    return x * 2", "class A: pass"]
    features = [{**dict(ours(t)), "label": i} for i, t in enumerate(texts)]
    _same(DataCollatorWithPadding(ours, **kw)(features), transformers.DataCollatorWithPadding(theirs, **kw)(features))


@pytest.mark.parametrize("as_dicts", [True, False])
def test_language_modeling_collator_matches_transformers(tokenizers, as_dicts):
    ours, theirs = tokenizers
    texts = ["import os", "def f(x):\n    return x * 2", "x = 1"]
    features = [dict(ours(t)) if as_dicts else ours(t)["input_ids"] for t in texts]
    a = DataCollatorForLanguageModeling(ours, mlm=False, pad_to_multiple_of=4)(features)
    b = transformers.DataCollatorForLanguageModeling(theirs, mlm=False, pad_to_multiple_of=4)(features)
    _same(a, b)
    assert (a["labels"] == -100).sum() == (a["input_ids"] == ours.pad_token_id).sum() > 0
    with pytest.raises(ValueError, match="mlm=True"):
        DataCollatorForLanguageModeling(ours)


def test_group_texts_as_run_clm():
    grouped = group_texts(
        {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "attention_mask": [[1] * 3, [1] * 2, [1] * 4]}, 4
    )
    assert grouped["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]  # the tail (9) shorter than a block is dropped
    assert grouped["labels"] == grouped["input_ids"] and grouped["attention_mask"] == [[1] * 4] * 2
    with pytest.raises(ValueError, match="block_size=0"):
        group_texts({"input_ids": [[1]]}, 0)


def test_grouped_datasets_map_style_and_iterable_agree(tokenizers):
    tok = tokenizers[0]
    tok.eos_token = "<|endoftext|>"
    texts = stdlib_texts(3)
    blocks = GroupedTextsDataset(tok, texts, block_size=32)
    streamed = list(IterableGroupedTextsDataset(tok, texts, block_size=32))
    assert len(blocks) == len(streamed) > 100
    ids = [t for text in texts for t in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    assert blocks[3]["input_ids"].tolist() == ids[96:128] == streamed[3]["input_ids"].tolist()
    assert torch.equal(blocks[5]["labels"], blocks[5]["input_ids"])
