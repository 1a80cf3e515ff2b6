"""``pipeline("text-classification")`` side by side with transformers' on the same tiny checkpoints (transformers
builds and saves a ``*ForSequenceClassification``; both libraries load it): the same labels and scores for one text,
a list, batches, text pairs, ``top_k``, ``function_to_apply``, and the config's problem types.

Mirrors transformers' tests/pipelines/test_pipelines_text_classification.py (test_small_model_pt, the top_k and
function_to_apply cases, test_pt_bert's batch and pair inputs) on local models."""

import os
import shutil

import pytest
import torch
from hf_lite import TextClassificationPipeline, pipeline

transformers = pytest.importorskip("transformers")

TEXTS = ["def f(x): return x", "import os", "class A:\n    pass", "x = [1, 2, 3]"]


def _checkpoint(tmp_path, tokenizer_dir, family="llama", **config):
    labels = config.pop("labels", ["neg", "neu", "pos"])
    common = dict(vocab_size=800, num_labels=len(labels), id2label=dict(enumerate(labels)),
                  label2id={label: i for i, label in enumerate(labels)}, pad_token_id=1, **config)
    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            **common))
    else:
        model = transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, n_positions=64, **common))
    directory = tmp_path / f"{family}-{len(labels)}"
    model.save_pretrained(directory)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text('{"pad_token": "<pad>", "padding_side": "right"}')
    return str(directory)


def _both(directory, *args, **kwargs):
    ours = pipeline("text-classification", model=directory, device="cpu")
    theirs = transformers.pipeline("text-classification", model=directory, device="cpu")
    return ours(*args, **kwargs), theirs(*args, **kwargs), ours


def _close(a, b):
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    else:
        assert a["label"] == b["label"] and a["score"] == pytest.approx(b["score"], rel=1e-5, abs=1e-7), (a, b)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_text_classification_matches_transformers(tmp_path, trained_tokenizer_dir, family):
    directory = _checkpoint(tmp_path, trained_tokenizer_dir, family)
    cases = [((TEXTS[0],), {}), ((TEXTS,), {}), ((TEXTS[0],), {"top_k": None}), ((TEXTS,), {"top_k": 2}),
             ((TEXTS[1],), {"function_to_apply": "sigmoid"}), ((TEXTS[1],), {"function_to_apply": "none"}),
             (({"text": TEXTS[0], "text_pair": TEXTS[1]},), {}), ((TEXTS,), {"batch_size": 2}),
             ((TEXTS,), {"batch_size": 3, "top_k": None})]
    for args, kwargs in cases:
        got, expected, pipe = _both(directory, *args, **kwargs)
        _close(got, expected)
    assert isinstance(pipe, TextClassificationPipeline)
    assert pipeline("sentiment-analysis", model=directory).task == "text-classification"


@pytest.mark.parametrize("config", [dict(problem_type="multi_label_classification"),
                                    dict(problem_type="regression", labels=["score"]), dict(labels=["yes"])])
def test_problem_type_chooses_the_function_as_transformers(tmp_path, trained_tokenizer_dir, config):
    directory = _checkpoint(tmp_path, trained_tokenizer_dir, **config)
    got, expected, _ = _both(directory, TEXTS, top_k=None)
    _close(got, expected)
    scores = [r["score"] for rows in got for r in rows]
    if config.get("problem_type") == "regression":
        assert any(s < 0 or s > 1 for s in scores) or len(set(scores)) > 1
    else:
        assert all(0 < s < 1 for s in scores)


def test_invalid_inputs_raise_as_transformers(tmp_path, trained_tokenizer_dir):
    directory = _checkpoint(tmp_path, trained_tokenizer_dir)
    for lib in (transformers, __import__("hf_lite")):
        pipe = lib.pipeline("text-classification", model=directory, device="cpu")
        with pytest.raises(ValueError, match="if you are trying to send text pairs"):
            pipe([["a", "b", "c"]])
        with pytest.raises(KeyError):
            pipe(TEXTS[0], function_to_apply="tanh")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_feature_extraction_matches_transformers(tmp_path, trained_tokenizer_dir, family):
    """``pipeline("feature-extraction")`` (transformers' test_pipelines_feature_extraction.py): the base model's
    hidden states per text, as lists or tensors, one text, a list, batches, truncation."""
    directory = _checkpoint(tmp_path, trained_tokenizer_dir, family)
    ours = pipeline("feature-extraction", model=directory, device="cpu")
    theirs = transformers.pipeline("feature-extraction", model=directory, device="cpu")
    assert type(ours.model).__name__ == type(theirs.model).__name__  # the base model, from AutoModel
    for args, kwargs in [((TEXTS[0],), {}), ((TEXTS,), {}), ((TEXTS,), {"batch_size": 2}),
                         ((TEXTS[2],), {"truncation": True, "tokenize_kwargs": {"max_length": 3}}),
                         ((TEXTS[1],), {"return_tensors": True})]:
        got, expected = ours(*args, **kwargs), theirs(*args, **kwargs)
        if isinstance(args[0], str):
            got, expected = [got], [expected]
        assert len(got) == len(expected)
        for g, e in zip(got, expected):  # texts of different lengths: one array each
            torch.testing.assert_close(torch.as_tensor(g), torch.as_tensor(e), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="truncation parameter defined twice"):
        ours(TEXTS[0], truncation=True, tokenize_kwargs={"truncation": True})
