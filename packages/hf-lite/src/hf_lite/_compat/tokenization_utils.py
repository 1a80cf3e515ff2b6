"""PreTrainedTokenizer: the pure-Python tokenizer base (transformers' slow ``tokenization_utils``).

It owns the added tokens: text is first cut around them (leftmost-longest match, as the Rust ``AddedVocabulary``
does) so they are never split, and only the pieces between them reach the model's ``_tokenize``.
"""

from __future__ import annotations

import abc

import regex
from tokenizers import AddedToken

from .tokenization_utils_base import PreTrainedTokenizerBase


class PreTrainedTokenizer(PreTrainedTokenizerBase):
    """Subclasses set up their vocabulary, then call ``super().__init__``; they implement ``_tokenize`` (text ->
    token strings), ``_convert_token_to_id``, ``_convert_id_to_token`` and ``convert_tokens_to_string``."""

    def __init__(self, added_tokens: list[dict] | None = None, **kwargs):
        self._added_tokens_encoder: dict[str, int] = {}
        self._added_tokens_decoder: dict[int, str] = {}
        self._special_added: set[str] = set()
        self._split_re = None
        for tok in added_tokens or []:
            self._register_added(tok["content"], tok["id"], tok.get("special", False))
        super().__init__(**kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> PreTrainedTokenizer:
        """The pure-Python tokenizer for the files: byte-level BPE (a tokenizer.json, or vocab.json + merges.txt) is
        ``GPT2Tokenizer`` (transformers' PythonBackend cannot load a lone tokenizer.json). The subclass that reads
        such files declares itself (``reads_byte_level_files=True``), so this module never imports it."""
        loader = PreTrainedTokenizer._byte_level_loader
        if loader is None:
            raise ValueError("no pure-Python byte-level BPE tokenizer is defined (import hf_lite.tokenization_gpt2)")
        return loader.from_pretrained(pretrained_model_name_or_path, **kwargs)

    _byte_level_loader: type | None = None

    def __init_subclass__(cls, reads_byte_level_files: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        if reads_byte_level_files:
            PreTrainedTokenizer._byte_level_loader = cls

    # ------------------------------------------------------------------ model hooks
    @abc.abstractmethod
    def _tokenize(self, text: str, add_prefix_space: bool | None = None) -> list[str]:
        """Split a piece of text (no added tokens in it) into model tokens."""

    @abc.abstractmethod
    def _convert_token_to_id(self, token: str) -> int | None:
        """Model-vocabulary id, or None."""

    @abc.abstractmethod
    def _convert_id_to_token(self, index: int) -> str:
        """Model-vocabulary token."""

    @abc.abstractmethod
    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Join model tokens back to text."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Size of the model vocabulary, without added tokens."""

    # ------------------------------------------------------------------ added tokens
    def _register_added(self, content: str, index: int, special: bool) -> None:
        self._added_tokens_encoder[content] = index
        self._added_tokens_decoder[index] = content
        if special:
            self._special_added.add(content)
        self._split_re = None

    def _add_tokens(self, tokens: list[str], special_tokens: bool = False) -> int:
        added = 0
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(f"added tokens must be non-empty strings, got {token!r}")
            if token in self._added_tokens_encoder:
                if special_tokens:
                    self._special_added.add(token)
                continue
            existing = self._convert_token_to_id(token)
            index = existing if existing is not None else len(self)
            self._register_added(token, index, special_tokens)
            added += existing is None
        return added

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return dict(self._added_tokens_encoder)

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return {i: AddedToken(c, special=c in self._special_added, normalized=c not in self._special_added)
                for i, c in sorted(self._added_tokens_decoder.items())}

    def get_vocab(self) -> dict[str, int]:
        tokens = ((self._convert_id_to_token(i), i) for i in range(self.vocab_size))
        vocab = {t: i for t, i in tokens if t is not None}
        vocab.update(self._added_tokens_encoder)
        return vocab

    def __len__(self) -> int:
        return max(self.vocab_size, max(self._added_tokens_decoder, default=-1) + 1)

    def _token_to_id(self, token: str) -> int | None:
        if token in self._added_tokens_encoder:
            return self._added_tokens_encoder[token]
        return self._convert_token_to_id(token)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            if ids in self._added_tokens_decoder:
                return self._added_tokens_decoder[ids]
            return self._convert_id_to_token(ids) if 0 <= ids < self.vocab_size else None  # None as in Rust
        special = {self._token_to_id(t) for t in self.all_special_tokens} | {
            self._added_tokens_encoder[t] for t in self._special_added
        }
        return [self.convert_ids_to_tokens(i) for i in ids if not (skip_special_tokens and i in special)]

    # ------------------------------------------------------------------ encode / decode
    def _split_on_added_tokens(self, text: str) -> list[tuple[str, bool]]:
        # split_special_tokens: special added tokens are plain text; the others still split
        tokens = [t for t in self._added_tokens_encoder if not (self.split_special_tokens and t in self._special_added)]
        if not tokens:
            return [(text, False)] if text else []
        if self._split_re is None or self._split_re[0] != self.split_special_tokens:
            # Longest alternatives first: at one position the longest added token wins.
            tokens = sorted(tokens, key=len, reverse=True)
            self._split_re = (self.split_special_tokens, regex.compile("|".join(regex.escape(t) for t in tokens)))
        pieces, last = [], 0
        for match in self._split_re[1].finditer(text):
            if match.start() > last:
                pieces.append((text[last : match.start()], False))
            pieces.append((match.group(), True))
            last = match.end()
        if last < len(text):
            pieces.append((text[last:], False))
        return pieces

    def _encode_texts(self, texts: list[str], add_prefix_space: bool | None = None) -> list[list[int]]:
        out = []
        for text in texts:
            ids = []
            for piece, is_added in self._split_on_added_tokens(text):
                for token in [piece] if is_added else self._tokenize(piece, add_prefix_space):
                    index = self._token_to_id(token)
                    if index is None:
                        unk = self._special["unk_token"]
                        if unk is None:
                            raise ValueError(f"token {token!r} is not in the vocabulary and there is no unk_token")
                        index = self._token_to_id(unk)
                    ids.append(index)
            out.append(ids)
        return out

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        special_ids = {self._token_to_id(t) for t in self.all_special_tokens} | {
            self._added_tokens_encoder[t] for t in self._special_added
        }
        parts, run = [], []
        for i in ids:
            if skip_special_tokens and i in special_ids:
                continue
            if i in self._added_tokens_decoder:
                if run:
                    parts.append(self.convert_tokens_to_string(run))
                    run = []
                parts.append(self._added_tokens_decoder[i])
            elif (token := self.convert_ids_to_tokens(i)) is not None:
                run.append(token)
        if run:
            parts.append(self.convert_tokens_to_string(run))
        return "".join(parts)
