"""PreTrainedTokenizerFast: the shared tokenizer interface over the Rust ``tokenizers`` library.

The Rust tokenizer does the splitting and merging; padding, truncation and special-token templates are done in
the shared base class so both tokenizers behave identically. ``train_new_from_iterator`` trains a new BPE with the
same pipeline (normaliser, pre-tokeniser, decoder) on a stream of texts, as transformers does.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from .._infra.atomic_io import atomic_write_text
from .tokenization_special_tokens import _content
from .tokenization_utils_base import TOKENIZER_FILE, PreTrainedTokenizerBase, tokenizer_directory


class PreTrainedTokenizerFast(PreTrainedTokenizerBase):
    def __init__(
        self,
        tokenizer_object: Tokenizer | None = None,
        tokenizer_file: str | None = None,
        add_prefix_space: bool | None = None,
        **kwargs,
    ):
        if tokenizer_object is None and tokenizer_file is None:
            raise ValueError("PreTrainedTokenizerFast needs `tokenizer_object` or `tokenizer_file` (a tokenizer.json)")
        if tokenizer_object is None:
            try:
                tokenizer_object = Tokenizer.from_file(os.fspath(tokenizer_file))
            except Exception as err:  # the Rust side raises a bare Exception
                raise ValueError(f"cannot load {tokenizer_file}: {err}") from err
        self._tokenizer = tokenizer_object
        # Padding/truncation belong to the Python side; a tokenizer.json may carry its own settings.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._prefix_space_variants: dict = {}
        if add_prefix_space is not None:
            self._tokenizer = self._with_prefix_space(add_prefix_space)
        super().__init__(**kwargs)
        spec = json.loads(self._tokenizer.to_str())
        self._set_post_processor(spec.get("post_processor"))
        if self.templated:  # the Rust side encodes what add_bos_token / add_eos_token asked for too
            spec["post_processor"] = self._template.to_post_processor()
            self._tokenizer = Tokenizer.from_str(json.dumps(spec))

    def _with_prefix_space(self, add_prefix_space: bool) -> Tokenizer:
        """A copy of the Rust tokenizer whose ByteLevel pre-tokenizer has ``add_prefix_space`` set."""
        spec = json.loads(self._tokenizer.to_str())
        pre = spec.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
        if not byte_level:
            raise ValueError(f"add_prefix_space needs a ByteLevel pre_tokenizer, this one is {pre.get('type')!r}")
        for step in byte_level:
            step["add_prefix_space"] = add_prefix_space
        return Tokenizer.from_str(json.dumps(spec))

    def _backend(self, add_prefix_space: bool | None) -> Tokenizer:
        if add_prefix_space is None:
            return self._tokenizer
        key = (add_prefix_space, len(self))  # rebuilt once tokens are added
        if key not in self._prefix_space_variants:
            self._prefix_space_variants = {key: self._with_prefix_space(add_prefix_space)}
        return self._prefix_space_variants[key]

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def _token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        special = set(self.all_special_ids) | self._added_special_ids()
        return [self._tokenizer.id_to_token(i) for i in ids if not (skip_special_tokens and i in special)]

    @property
    def added_tokens_decoder(self) -> dict:
        """``{id: AddedToken}`` of the Rust tokenizer's added tokens, by id."""
        return dict(sorted(self._tokenizer.get_added_tokens_decoder().items()))

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {token.content: index for index, token in self.added_tokens_decoder.items()}

    def _added_special_ids(self) -> set[int]:
        return {i for i, tok in self._tokenizer.get_added_tokens_decoder().items() if tok.special}

    def _add_tokens(self, tokens: list[str], special_tokens: bool = False) -> int:
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(f"added tokens must be non-empty strings, got {token!r}")
        objs = [AddedToken(t, special=special_tokens, normalized=not special_tokens) for t in tokens]
        if special_tokens:
            return self._tokenizer.add_special_tokens(objs)
        return self._tokenizer.add_tokens(objs)

    def _encode_texts(self, texts: list[str], add_prefix_space: bool | None = None) -> list[list[int]]:
        backend = self._backend(add_prefix_space)
        backend.encode_special_tokens = self.split_special_tokens
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            # The Rust flag only knows tokens flagged special; our bos/eos/pad may be plain vocabulary entries.
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._tokenizer.decoder.decode(tokens) if self._tokenizer.decoder else " ".join(tokens)

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "", **kwargs
    ) -> PreTrainedTokenizerFast:
        directory = tokenizer_directory(pretrained_model_name_or_path, subfolder, kwargs)
        path = os.path.join(directory, TOKENIZER_FILE)
        if not os.path.isfile(path):
            raise OSError(f"{directory!r} does not contain {TOKENIZER_FILE}")
        config = cls._read_tokenizer_config(directory, kwargs)
        return cls(tokenizer_file=path, **config)

    def _save_vocabulary_files(self, save_directory: str) -> list[str]:
        atomic_write_text(os.path.join(save_directory, TOKENIZER_FILE), self._tokenizer.to_str(pretty=True))
        return [TOKENIZER_FILE]

    # ------------------------------------------------------------------ training
    def train_new_from_iterator(
        self,
        text_iterator,
        vocab_size: int,
        length: int | None = None,
        new_special_tokens=None,
        special_tokens_map: dict | None = None,
        **kwargs,
    ) -> PreTrainedTokenizerFast:
        """A new tokenizer with this one's pipeline and a BPE vocabulary learned from ``text_iterator``."""
        spec = json.loads(self._tokenizer.to_str())
        if spec["model"]["type"] != "BPE":
            raise ValueError(f"train_new_from_iterator supports BPE models, not {spec['model']['type']!r}")
        if not isinstance(vocab_size, int) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        specials = [t["content"] for t in spec.get("added_tokens", []) if t.get("special")]
        specials += [_content(t) for t in (new_special_tokens or []) if _content(t) not in specials]
        special_tokens_map = special_tokens_map or {}
        specials = [special_tokens_map.get(t, t) for t in specials]
        spec["added_tokens"] = []
        spec["model"]["vocab"], spec["model"]["merges"] = {}, []
        tokenizer = Tokenizer.from_str(json.dumps(spec))
        byte_level = spec.get("pre_tokenizer", {}) and "ByteLevel" in json.dumps(spec["pre_tokenizer"])
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [],
            show_progress=False,
            **kwargs,
        )
        tokenizer.train_from_iterator(text_iterator, trainer=trainer, length=length)
        init = self._tokenizer_config()
        for key in ("tokenizer_class", "chat_template"):
            init.pop(key, None)
        for attr, token in list(init.items()):
            if isinstance(token, str) and token in special_tokens_map:
                init[attr] = special_tokens_map[token]
        return type(self)(tokenizer_object=tokenizer, chat_template=self.chat_template, **init)


def byte_level_bpe_tokenizer(add_prefix_space: bool = False) -> Tokenizer:
    """An empty GPT-2-style byte-level BPE pipeline, ready for training."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    from tokenizers import decoders, processors

    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok
