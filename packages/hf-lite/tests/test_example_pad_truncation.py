"""``examples/pad_truncation.py`` (transformers' docs page ``pad_truncation.md``, its table's instructions) prints the
same ids and attention masks under hf-lite as its upstream form (the import swapped back) under transformers, on a
local GPT-2 checkpoint transformers saved, with and without a ``model_max_length``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys

import pytest
import torch
import transformers

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "pad_truncation.py")
IMPORT = ("from hf_lite import AutoTokenizer\n", "from transformers import AutoTokenizer\n")


def _run(path: str, checkpoint: str, monkeypatch) -> str:
    monkeypatch.setattr(sys, "argv", [path, checkpoint])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    return out.getvalue()


@pytest.mark.parametrize("model_max_length", [None, 12])
def test_pad_truncation_page_prints_what_transformers_prints(model_max_length, trained_tokenizer_dir, tmp_path,
                                                             monkeypatch):
    checkpoint = tmp_path / "gpt2"
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=800, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(checkpoint)
    transformers.AutoTokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>").save_pretrained(checkpoint)
    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    tokenizer_config.pop("model_max_length", None)
    if model_max_length is not None:
        tokenizer_config["model_max_length"] = model_max_length
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    header, body = open(EXAMPLE, encoding="utf-8").read().split("# hf-lite drop-in <<<\n")
    assert "huggingface/transformers docs/source/en/pad_truncation.md" in header and body.count(IMPORT[0]) == 1
    upstream = tmp_path / "pad_truncation_upstream.py"
    upstream.write_text(body.replace(*IMPORT), encoding="utf-8")

    ours = _run(EXAMPLE, str(checkpoint), monkeypatch)
    theirs = _run(str(upstream), str(checkpoint), monkeypatch)
    assert ours == theirs
    assert ours.count("tokenizer(batch_sentences") == 18
    lengths = {len(line.split("] [")[0].split(",")) for line in ours.splitlines() if line.startswith("    [")}
    assert 42 in lengths and (12 in lengths) == (model_max_length is not None)  # truncated to it
