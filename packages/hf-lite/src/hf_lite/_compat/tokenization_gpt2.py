"""GPT2Tokenizer: transformers' pure-Python tokenizer interface (``PreTrainedTokenizer``) over the core byte-level
BPE (``byte_level_bpe.py``: the pre-tokenizer and the merge loop), reading ``vocab.json`` + ``merges.txt`` or a
``tokenizer.json`` (``tokenizer_json.py``) and writing all three back.
"""

from __future__ import annotations

import json
import os

from .._infra.atomic_io import atomic_write_text
from ..byte_level_bpe import GPT2_SPLIT_PATTERN, ByteLevelBPE
from .tokenization_utils import PreTrainedTokenizer
from .tokenization_utils_base import TOKENIZER_FILE, tokenizer_directory
from .tokenizer_json import read_byte_level_bpe

VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}


class GPT2Tokenizer(PreTrainedTokenizer, reads_byte_level_files=True):
    vocab_files_names = VOCAB_FILES_NAMES
    vocab_files = ("vocab.json", "merges.txt", TOKENIZER_FILE)
    extra_init_kwargs = ("errors",)

    def __init__(
        self,
        vocab: dict[str, int] | str,
        merges: list | str,
        add_prefix_space: bool = False,
        errors: str = "replace",
        post_processor: dict | None = None,
        split_pattern: str = GPT2_SPLIT_PATTERN,
        ignore_merges: bool = False,
        **kwargs,
    ):
        """``split_pattern``: the pre-tokenizer regex (GPT-2's, or a tokenizer.json ``Split``'s such as Llama 3's);
        ``ignore_merges``: a whole word that is in the vocabulary is one token (tokenizers' BPE option)."""
        if isinstance(vocab, (str, os.PathLike)):  # transformers 5 takes the files' paths too
            with open(vocab, encoding="utf-8") as f:
                vocab = json.load(f)
        if isinstance(merges, (str, os.PathLike)):
            with open(merges, encoding="utf-8") as f:
                merges = [ln.rstrip("\n") for ln in f if ln.strip() and not ln.startswith("#version")]
        self.model = ByteLevelBPE(vocab, merges, split_pattern, add_prefix_space, ignore_merges)
        # transformers' GPT2Tokenizer attributes: the model's own objects
        model = self.model
        self.encoder, self.decoder, self.bpe_ranks, self.bpe = model.encoder, model.decoder, model.bpe_ranks, model.bpe
        self.byte_encoder, self.byte_decoder = model.byte_encoder, model.byte_decoder
        self.cache, self.pat = model.cache, model.pat
        self.add_prefix_space, self.split_pattern, self.ignore_merges = add_prefix_space, split_pattern, ignore_merges
        self.errors = errors
        self._post_processor = post_processor
        if "<|endoftext|>" in self.encoder:  # transformers' defaults for unk, bos and eos (GPT-2's one special token)
            for name in ("unk_token", "bos_token", "eos_token"):
                kwargs.setdefault(name, "<|endoftext|>")
        super().__init__(**kwargs)
        self._set_post_processor(post_processor)

    # ------------------------------------------------------------------ the model
    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def _tokenize(self, text: str, add_prefix_space: bool | None = None) -> list[str]:
        return self.model.tokenize(text, self.add_prefix_space if add_prefix_space is None else add_prefix_space)

    def _convert_token_to_id(self, token: str) -> int | None:
        return self.encoder.get(token)

    def _convert_id_to_token(self, index: int) -> str | None:
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return b"".join(self.model.token_bytes(t) for t in tokens).decode("utf-8", errors=self.errors)

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        tokens = self.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        return self.convert_tokens_to_string([t for t in tokens if t is not None])

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "", **kwargs
    ) -> GPT2Tokenizer:
        directory = tokenizer_directory(pretrained_model_name_or_path, subfolder, kwargs)
        config = cls._read_tokenizer_config(directory, kwargs)
        tokenizer_json = os.path.join(directory, TOKENIZER_FILE)
        vocab_file = os.path.join(directory, VOCAB_FILES_NAMES["vocab_file"])
        merges_file = os.path.join(directory, VOCAB_FILES_NAMES["merges_file"])
        if os.path.isfile(tokenizer_json):
            return cls.from_tokenizer_json(tokenizer_json, **config)
        if os.path.isfile(vocab_file) and os.path.isfile(merges_file):
            added = []
            added_file = os.path.join(directory, "added_tokens.json")
            if os.path.isfile(added_file):
                with open(added_file, encoding="utf-8") as f:
                    added = [{"content": c, "id": i, "special": True} for c, i in json.load(f).items()]
            return cls(vocab_file, merges_file, added_tokens=added, **config)
        raise OSError(f"{directory!r} has neither {TOKENIZER_FILE} nor vocab.json + merges.txt")

    @classmethod
    def from_tokenizer_json(cls, path: str, **kwargs) -> GPT2Tokenizer:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        return cls(**{**read_byte_level_bpe(spec, path), **kwargs})

    def to_tokenizer_json(self) -> dict:
        """The ``tokenizers`` library's serialisation of this tokenizer, so the Rust side can load our files."""
        added = [
            {
                "id": i,
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": c not in self._special_added,
                "special": c in self._special_added,
            }
            for i, c in sorted(self._added_tokens_decoder.items())
        ]
        merges = [list(p) for p, _ in sorted(self.bpe_ranks.items(), key=lambda kv: kv[1])]
        post_processor = self._template.to_post_processor() if self.templated else self._post_processor
        return write_byte_level_bpe(
            self.encoder, merges, added, self.add_prefix_space, self.split_pattern, self.ignore_merges, post_processor
        )

    def _save_vocabulary_files(self, save_directory: str) -> list[str]:
        atomic_write_text(os.path.join(save_directory, "vocab.json"), json.dumps(self.encoder, ensure_ascii=False))
        merges = "#version: 0.2\n" + "".join(
            f"{a} {b}\n" for (a, b), _ in sorted(self.bpe_ranks.items(), key=lambda kv: kv[1])
        )
        atomic_write_text(os.path.join(save_directory, "merges.txt"), merges)
        tokenizer_json = json.dumps(self.to_tokenizer_json(), ensure_ascii=False)
        atomic_write_text(os.path.join(save_directory, TOKENIZER_FILE), tokenizer_json)
        return list(self.vocab_files)

    def _tokenizer_config(self) -> dict:
        config = super()._tokenizer_config()
        config["add_prefix_space"] = self.add_prefix_space
        if self.split_pattern != GPT2_SPLIT_PATTERN or self.ignore_merges:
            # transformers' GPT2Tokenizer rebuilds GPT-2's own pipeline from vocab + merges; this one needs the
            # tokenizer.json as written, which transformers 5 loads for TokenizersBackend.
            config["tokenizer_class"] = "TokenizersBackend"
        return config


def write_byte_level_bpe(vocab, merges, added, add_prefix_space, split_pattern, ignore_merges, post_processor):
    """tokenizer.json as the ``tokenizers`` library writes a byte-level BPE, so the Rust side loads our files."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": True}
    pre = byte_level
    if split_pattern != GPT2_SPLIT_PATTERN:
        split = {"type": "Split", "pattern": {"Regex": split_pattern}, "behavior": "Isolated", "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [split, {**byte_level, "use_regex": False}]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": post_processor or byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }
