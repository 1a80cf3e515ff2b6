"""Fixtures: a byte-level BPE trained on the stdlib's own source; helpers live in hf_lite_testing.py."""

from __future__ import annotations

import os
import sys

import pytest
from tokenizers import Tokenizer, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(__file__))

from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer  # noqa: E402
from hf_lite_testing import SPECIALS, stdlib_texts  # noqa: E402


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return stdlib_texts()


@pytest.fixture(scope="session")
def trained_tokenizer_dir(tmp_path_factory, corpus) -> str:
    """tokenizer.json of a byte-level BPE (vocab 800) trained by the `tokenizers` library on the stdlib corpus."""
    tok = byte_level_bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    directory = tmp_path_factory.mktemp("bpe")
    tok.save(str(directory / "tokenizer.json"))
    return str(directory)


@pytest.fixture(scope="session")
def templated_tokenizer_dir(tmp_path_factory, trained_tokenizer_dir) -> str:
    """Same BPE with a Llama-like TemplateProcessing post-processor (bos prefix, eos suffix)."""
    tok = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
    bos, eos = "<|im_start|>", "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))]
    )
    directory = tmp_path_factory.mktemp("bpe_tpl")
    tok.save(str(directory / "tokenizer.json"))
    return str(directory)
