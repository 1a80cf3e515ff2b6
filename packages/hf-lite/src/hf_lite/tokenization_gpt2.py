"""GPT2Tokenizer: byte-level BPE in pure Python (Radford et al. 2019 sec. 2.2; the algorithm as minbpe teaches it).

1. The GPT-2 regex pre-splits text into words, digits, punctuation runs and whitespace, so merges never cross them.
2. Each word's UTF-8 bytes are mapped to printable unicode characters (``bytes_to_unicode``), so every byte is a
   base token and no text is ever "unknown" (a vocabulary missing some bytes drops them, as tokenizers' BPE
   without an ``unk_token``, which transformers 5's GPT2Tokenizer builds).
3. Merges are applied by rank: repeatedly merge the adjacent pair with the lowest rank, until none is mergeable.
Results are cached per word. Reads ``vocab.json`` + ``merges.txt`` or a ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

import regex

from .hub_utils import pop_hub_kwargs
from .tokenization_utils import PreTrainedTokenizer
from .tokenization_utils_base import TOKENIZER_FILE
from .tokenizer_json import GPT2_SPLIT_PATTERN, read_byte_level_bpe, write_byte_level_bpe
from .utils import atomic_write_text

VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable char: printable Latin-1 bytes map to themselves, the rest to chars from U+0100 on."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping, shift = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def _parse_merges(merges) -> list[tuple[str, str]]:
    pairs = []
    for m in merges:
        pair = tuple(m) if isinstance(m, (list, tuple)) else tuple(m.split(" "))
        if len(pair) != 2:
            raise ValueError(f"malformed merge {m!r}: expected two space-separated tokens")
        pairs.append(pair)
    return pairs


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
        self.encoder = dict(vocab)
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(_parse_merges(merges))}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._byte_chars = [self.byte_encoder[b] for b in range(256)]
        self.add_prefix_space = add_prefix_space
        self.errors = errors
        self.split_pattern = split_pattern
        self.pat = regex.compile(split_pattern)
        self.ignore_merges = ignore_merges
        self.cache: dict[str, list[str]] = {}
        self._post_processor = post_processor
        if "<|endoftext|>" in self.encoder:  # transformers' defaults for unk, bos and eos (GPT-2's one special token)
            for name in ("unk_token", "bos_token", "eos_token"):
                kwargs.setdefault(name, "<|endoftext|>")
        super().__init__(**kwargs)
        self._set_post_processor(post_processor)

    # ------------------------------------------------------------------ BPE
    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def bpe(self, token: str) -> list[str]:
        if token in self.cache:
            return self.cache[token]
        if self.ignore_merges and token in self.encoder:
            return [token]
        word = [c for c in token if c in self.encoder]  # a byte outside the vocabulary is dropped
        while len(word) > 1:
            ranked = [(self.bpe_ranks.get(pair, float("inf")), pair) for pair in zip(word, word[1:])]
            rank, best = min(ranked, key=lambda x: x[0])
            if rank == float("inf"):
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        if len(self.cache) < 100_000:
            self.cache[token] = word
        return word

    def _tokenize(self, text: str, add_prefix_space: bool | None = None) -> list[str]:
        add_prefix_space = self.add_prefix_space if add_prefix_space is None else add_prefix_space
        if add_prefix_space and text and not text[0].isspace():
            text = " " + text
        words = self.pat.findall(text)
        if sum(map(len, words)) != len(text):
            # tokenizers' Split "Isolated": the text between matches is a piece too (GPT-2's regex leaves none).
            words, last = [], 0
            for match in self.pat.finditer(text):
                words += [w for w in (text[last : match.start()], match.group()) if w]
                last = match.end()
            words += [text[last:]] if text[last:] else []
        table, tokens = self._byte_chars, []
        for word in words:
            tokens.extend(self.bpe("".join(map(table.__getitem__, word.encode("utf-8")))))
        return tokens

    def _convert_token_to_id(self, token: str) -> int | None:
        return self.encoder.get(token)

    def _convert_id_to_token(self, index: int) -> str | None:
        return self.decoder.get(index)

    def _token_bytes(self, token: str) -> bytes:
        # As the Rust ByteLevel decoder: a token made of table chars is bytes, anything else is its own UTF-8.
        try:
            return bytes(self.byte_decoder[c] for c in token)
        except KeyError:
            return token.encode("utf-8")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return b"".join(self._token_bytes(t) for t in tokens).decode("utf-8", errors=self.errors)

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        tokens = self.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        return self.convert_tokens_to_string([t for t in tokens if t is not None])

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "", **kwargs
    ) -> GPT2Tokenizer:
        pop_hub_kwargs(kwargs)
        directory = os.path.join(os.fspath(pretrained_model_name_or_path), subfolder)
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
