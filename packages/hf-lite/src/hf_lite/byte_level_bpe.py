"""Byte-level BPE (Radford et al. 2019 sec. 2.2; the algorithm as minbpe teaches it, the pipeline as the ``tokenizers``
library runs GPT-2's and Llama 3's: a ``ByteLevel`` pre-tokenizer, a ``BPE`` model, a ``ByteLevel`` decoder).

1. A regex pre-splits text into words, digits, punctuation runs and whitespace, so merges never cross them (GPT-2's
   pattern, or a tokenizer.json ``Split``'s such as Llama 3's, whose text between matches is a piece too).
2. Each piece's UTF-8 bytes are mapped to printable unicode characters (``bytes_to_unicode``), so every byte is a base
   token and no text is ever "unknown" (a vocabulary missing some bytes drops them, as tokenizers' BPE without an
   ``unk_token`` does).
3. Merges are applied by rank: repeatedly merge the adjacent pair with the lowest rank, until none is mergeable.
Results are cached per piece. ``_compat/tokenizer_json.py`` reads the vocabulary, merges and pattern from a file.

``train_bpe`` learns the vocabulary and merges from text (Sennrich et al. 2016; minbpe's ``train``), with the
choices of the ``tokenizers`` library's ``BpeTrainer``, so both learn the same merges from the same corpus.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import regex

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


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


def _pair(merge) -> tuple[str, str]:
    """A merge as tokenizer.json (``["a", "b"]``, or ``"a b"`` in older files) and merges.txt (``a b``) write it."""
    pair = tuple(merge) if isinstance(merge, (list, tuple)) else tuple(merge.split(" "))
    if len(pair) != 2:
        raise ValueError(f"malformed merge {merge!r}: expected two space-separated tokens")
    return pair


def merge_pair(word: list[str], pair: tuple[str, str]) -> list[str]:
    """``word`` with each occurrence of ``pair``, left to right and not overlapping, made one token."""
    merged, i = [], 0
    while i < len(word):
        if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


class ByteLevelBPE:
    """``encode(text) -> ids`` and ``decode(ids) -> text`` over a vocabulary (token -> id) and ranked merges.

    ``ignore_merges``: a whole piece that is in the vocabulary is one token (tokenizers' BPE option; Llama 3's)."""

    def __init__(self, vocab: dict[str, int], merges: list, split_pattern: str = GPT2_SPLIT_PATTERN,
                 add_prefix_space: bool = False, ignore_merges: bool = False):
        self.encoder = dict(vocab)
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.bpe_ranks = {_pair(m): rank for rank, m in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.split_pattern, self.pat = split_pattern, regex.compile(split_pattern)
        self.add_prefix_space, self.ignore_merges = add_prefix_space, ignore_merges
        self.cache: dict[str, list[str]] = {}

    def pre_tokenize(self, text: str, add_prefix_space: bool | None = None) -> list[str]:
        """The regex's pieces, each as its bytes' printable characters."""
        add_prefix_space = self.add_prefix_space if add_prefix_space is None else add_prefix_space
        if add_prefix_space and text and not text[0].isspace():
            text = " " + text
        pieces = self.pat.findall(text)
        if sum(map(len, pieces)) != len(text):  # tokenizers' Split "Isolated": the text between matches counts too
            pieces, last = [], 0
            for match in self.pat.finditer(text):
                pieces += [w for w in (text[last : match.start()], match.group()) if w]
                last = match.end()
            pieces += [text[last:]] if text[last:] else []
        char = [self.byte_encoder[b] for b in range(256)].__getitem__
        return ["".join(map(char, piece.encode("utf-8"))) for piece in pieces]

    def bpe(self, token: str) -> list[str]:
        """The merge loop: merge the lowest-ranked adjacent pair until no pair has a rank."""
        if token in self.cache:
            return self.cache[token]
        if self.ignore_merges and token in self.encoder:
            return [token]
        word = [c for c in token if c in self.encoder]  # a byte outside the vocabulary is dropped
        while len(word) > 1:
            rank, best = min((self.bpe_ranks.get(pair, float("inf")), pair) for pair in zip(word, word[1:]))
            if rank == float("inf"):
                break
            word = merge_pair(word, best)
        if len(self.cache) < 100_000:
            self.cache[token] = word
        return word

    def tokenize(self, text: str, add_prefix_space: bool | None = None) -> list[str]:
        return [token for piece in self.pre_tokenize(text, add_prefix_space) for token in self.bpe(piece)]

    def encode(self, text: str) -> list[int]:
        return [self.encoder[token] for token in self.tokenize(text)]

    def token_bytes(self, token: str) -> bytes:
        # As the ByteLevel decoder: a token made of table chars is bytes, anything else (an added token) its UTF-8.
        try:
            return bytes(self.byte_decoder[c] for c in token)
        except KeyError:
            return token.encode("utf-8")

    def decode(self, ids: list[int], errors: str = "replace") -> str:
        tokens = (self.decoder[i] for i in ids if i in self.decoder)
        return b"".join(map(self.token_bytes, tokens)).decode("utf-8", errors=errors)


def train_bpe(texts, vocab_size: int, min_frequency: int = 0, special_tokens=(), initial_alphabet=(),
              split_pattern: str = GPT2_SPLIT_PATTERN, add_prefix_space: bool = False):
    """``(vocab, merges)`` learned from ``texts`` as ``tokenizers``' ``BpeTrainer`` over a ``ByteLevel``
    pre-tokenizer: the special tokens first, then the alphabet (the pieces' characters and ``initial_alphabet``) by
    code point, then one token per merge of the most frequent adjacent pair (ties: the lowest ids), until
    ``vocab_size`` tokens or no pair seen ``min_frequency`` times."""
    splitter = ByteLevelBPE({}, [], split_pattern, add_prefix_space)
    counts = Counter(piece for text in texts for piece in splitter.pre_tokenize(text))
    vocab: dict[str, int] = {}
    for token in [*special_tokens, *sorted(set(initial_alphabet).union(*counts))]:
        vocab.setdefault(token, len(vocab))
    words, merges = [(list(piece), n) for piece, n in counts.items()], []
    while len(vocab) < vocab_size:
        stats = Counter()
        for word, n in words:
            for pair in zip(word, word[1:]):
                stats[pair] += n
        best = max(stats, key=lambda p: (stats[p], -vocab[p[0]], -vocab[p[1]]), default=None)
        if best is None or stats[best] < max(min_frequency, 1):
            break
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        words = [(merge_pair(word, best), n) if len(word) > 1 else (word, n) for word, n in words]
    return vocab, merges
