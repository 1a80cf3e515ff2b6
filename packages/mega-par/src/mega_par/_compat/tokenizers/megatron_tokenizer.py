"""``MegatronTokenizer.from_pretrained``: a Hugging Face tokenizer directory, or the synthetic ``null-text``
tokenizer (``megatron/core/tokenizers/megatron_tokenizer.py``, ``text/libraries/null_tokenizer.py`` and
``huggingface_tokenizer.py``). Both expose what the datasets use: ``vocab_size``, ``eod``, ``pad``,
``tokenize(text) -> ids``, ``detokenize(ids) -> text``.
"""

from __future__ import annotations

import json
import os


class _NullTokenizer:
    """Text is space-separated ids; ``eod = vocab_size - 1`` unless given (upstream's ``NullTokenizer``)."""

    def __init__(self, vocab_size: int, eod_id: int | None = None, pad_id: int = -1):
        self.vocab_size = int(vocab_size)
        self.eod = int(eod_id) if eod_id is not None else self.vocab_size - 1
        self.pad = int(pad_id)

    def tokenize(self, text: str) -> list[int]:
        return [int(x) for x in text.split(" ")]

    def detokenize(self, ids) -> str:
        return " ".join(str(int(x)) for x in ids)


class _HuggingFaceTokenizer:
    """``transformers.AutoTokenizer`` from a local directory; ``eod`` is its EOS token (upstream's choice)."""

    def __init__(self, tokenizer_path: str, **kwargs):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, **kwargs)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"Hugging Face tokenizer at {tokenizer_path} has no eos_token: Megatron's datasets "
                             "need an end-of-document id")
        self.vocab_size = len(self.tokenizer)
        self.eod = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else -1

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


class MegatronTokenizer:
    """Upstream's entry point: ``from_pretrained(tokenizer_path=None, metadata_path=None, **kwargs)``."""

    @staticmethod
    def from_pretrained(tokenizer_path: str | None = None, metadata_path: str | dict | None = None, **kwargs):
        """``metadata_path``: a dict or a JSON file with ``library``: ``"null-text"`` (needs ``vocab_size``)
        or ``"huggingface"``; without it, ``tokenizer_path`` is read as a Hugging Face directory."""
        if isinstance(metadata_path, str):
            with open(metadata_path) as f:
                metadata_path = json.load(f)
        library = (metadata_path or {}).get("library", "huggingface" if tokenizer_path else None)
        if library == "null-text":
            if "vocab_size" not in kwargs:
                raise ValueError("MegatronTokenizer null-text needs vocab_size=")
            return _NullTokenizer(kwargs.pop("vocab_size"), **kwargs)
        if library == "huggingface":
            if not tokenizer_path or not os.path.isdir(tokenizer_path):
                raise ValueError(f"MegatronTokenizer huggingface: tokenizer_path {tokenizer_path!r} is not a directory")
            return _HuggingFaceTokenizer(tokenizer_path, **kwargs)
        raise ValueError(f"MegatronTokenizer: library {library!r} is not supported by mega_par "
                         "(null-text, huggingface)")
