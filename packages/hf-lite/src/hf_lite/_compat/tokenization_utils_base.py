"""PreTrainedTokenizerBase: the interface shared by the pure-Python and the Rust-backed tokenizer.

Subclasses provide ``_encode_texts`` (text -> ids without special tokens), ``_decode`` and the vocabulary; this
class does everything transformers users touch: ``__call__`` / ``encode`` / ``pad`` (through ``batch_encoding``),
``decode``, special and added tokens, the post-processor's special-token template, ``save_pretrained`` and chat
templates.
"""

from __future__ import annotations

import abc
import json
import os

import torch

from .._infra.atomic_io import atomic_save_directory, atomic_write_text
from .._infra.hub import PushToHubMixin, cached_directory, pop_hub_kwargs
from .batch_encoding import BatchEncoding, as_rows, encode_rows, finish_rows
from .chat_template_utils import render_conversations
from .tokenization_padding import VERY_LARGE_INTEGER, padding_truncation_strategies
from .tokenization_special_tokens import SPECIAL_TOKENS_ATTRIBUTES, SpecialTokensMixin, _content
from .tokenization_template import SpecialTokensTemplate

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
TOKENIZER_FILE = "tokenizer.json"
# The files a tokenizer of this library may read (config.json: AutoTokenizer's model_type), fetched from a hub repo.
TOKENIZER_FILES = [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, "vocab.json", "merges.txt",
                   "added_tokens.json", "config.json"]


def tokenizer_directory(pretrained_model_name_or_path, subfolder: str, kwargs: dict) -> str:
    """The directory of a tokenizer's files: a local directory, or the snapshot of a hub repo holding whichever of
    ``TOKENIZER_FILES`` it has (``_infra/hub.py``); the hub kwargs are taken out of ``kwargs``."""
    download, _ = pop_hub_kwargs(kwargs)  # a tokenizer runs no code of its own here: trust_remote_code changes nothing
    return cached_directory(pretrained_model_name_or_path, TOKENIZER_FILES, subfolder=subfolder, **download)
# What a caller may pass to from_pretrained / __init__. tokenizer_config.json may hold more; those are kept.
INIT_KWARGS = {
    *SPECIAL_TOKENS_ATTRIBUTES,
    "additional_special_tokens",
    "extra_special_tokens",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "chat_template",
    "clean_up_tokenization_spaces",
    "add_bos_token",
    "add_eos_token",
    "add_prefix_space",
    "split_special_tokens",
    "legacy",  # sentencepiece tokenizers' space handling; kept in init_kwargs, no effect on byte-level BPE
}

__all__ = ["BatchEncoding", "PreTrainedTokenizerBase"]


class PreTrainedTokenizerBase(SpecialTokensMixin, PushToHubMixin, abc.ABC):
    model_input_names = ["input_ids", "attention_mask"]
    vocab_files: tuple[str, ...] = (TOKENIZER_FILE,)

    def __init__(self, **kwargs):
        self.model_max_length = kwargs.pop("model_max_length", VERY_LARGE_INTEGER) or VERY_LARGE_INTEGER
        self.padding_side = kwargs.pop("padding_side", "right")
        self.truncation_side = kwargs.pop("truncation_side", "right")
        for name, side in (("padding_side", self.padding_side), ("truncation_side", self.truncation_side)):
            if side not in ("left", "right"):
                raise ValueError(f"{name} should be 'left' or 'right', got {side!r}")
        self.chat_template = kwargs.pop("chat_template", None)
        self.clean_up_tokenization_spaces = kwargs.pop("clean_up_tokenization_spaces", False)
        self.split_special_tokens = kwargs.pop("split_special_tokens", False)  # special tokens in text as plain text
        self._add_bos_token = kwargs.pop("add_bos_token", None)
        self._add_eos_token = kwargs.pop("add_eos_token", None)
        self._template = SpecialTokensTemplate.from_post_processor(None)
        self._special: dict[str, str | None] = dict.fromkeys(SPECIAL_TOKENS_ATTRIBUTES)
        self._additional_special_tokens: list[str] = []
        self.init_kwargs = {}
        extra = kwargs.pop("additional_special_tokens", None) or kwargs.pop("extra_special_tokens", None) or []
        for attr in SPECIAL_TOKENS_ATTRIBUTES:
            value = _content(kwargs.pop(attr, None))
            if value is not None:
                # transformers adds a special token it is given that the vocabulary lacks.
                self._add_tokens([value], special_tokens=True)
                self._set_special(attr, value)
        if isinstance(extra, dict):
            extra = list(extra.values())
        for tok in map(_content, extra):
            self._add_tokens([tok], special_tokens=True)
            self._additional_special_tokens.append(tok)
        self.init_kwargs.update(kwargs)

    @classmethod
    def _check_init_kwargs(cls, kwargs: dict) -> None:
        unknown = sorted(set(kwargs) - INIT_KWARGS - set(getattr(cls, "extra_init_kwargs", ())))
        if unknown:
            raise ValueError(f"{cls.__name__} does not take {unknown}; it takes {sorted(INIT_KWARGS)}")

    def _set_post_processor(self, post_processor: dict | None) -> None:
        """The tokenizer.json post-processor's template, or the one ``add_bos_token`` / ``add_eos_token`` make (which
        replaces the whole template, as in transformers 5: an unset flag counts as False)."""
        if self._add_bos_token is None and self._add_eos_token is None:
            template = SpecialTokensTemplate.from_post_processor(post_processor)
            for token in template.tokens:
                self._require_known(token, "post_processor")
        else:
            template = SpecialTokensTemplate.from_flags(
                self.bos_token,
                self.eos_token,
                bool(self._add_bos_token),
                bool(self._add_eos_token),
                self._token_to_id,
            )
        self._template = template

    @property
    def templated(self) -> bool:
        """Whether ``add_bos_token`` / ``add_eos_token`` rewrote the post-processor (saved as TemplateProcessing)."""
        return self._add_bos_token is not None or self._add_eos_token is not None

    # ------------------------------------------------------------------ vocabulary interface
    @abc.abstractmethod
    def _encode_texts(self, texts: list[str], add_prefix_space: bool | None = None) -> list[list[int]]:
        """Token ids for each text, added tokens honoured, no template special tokens."""

    @abc.abstractmethod
    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Text for ids."""

    @abc.abstractmethod
    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""

    @abc.abstractmethod
    def _add_tokens(self, tokens: list[str], special_tokens: bool) -> int:
        """Add tokens that are never split; return how many were new."""

    @abc.abstractmethod
    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """Id(s) -> token string(s)."""

    @abc.abstractmethod
    def _token_to_id(self, token: str) -> int | None:
        """Id of ``token`` or None."""

    @abc.abstractmethod
    def _save_vocabulary_files(self, save_directory: str) -> list[str]:
        """Write tokenizer.json (and vocab files); return their names."""

    def __len__(self) -> int:
        return len(self.get_vocab())

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self._template.num_special_tokens_to_add(pair)

    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1=None) -> list[int]:
        return self._template.apply(list(token_ids_0), None if token_ids_1 is None else list(token_ids_1))[0]

    def create_token_type_ids_from_sequences(self, token_ids_0: list[int], token_ids_1=None) -> list[int]:
        return self._template.apply(list(token_ids_0), None if token_ids_1 is None else list(token_ids_1))[1]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens: bool = False):
        """1 for a special token. With ``already_has_special_tokens`` the ids are checked against the special ids;
        otherwise the mask is the template's for ids it would wrap."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise ValueError("already_has_special_tokens=True takes one sequence with its special tokens")
            special = set(self.all_special_ids)
            return [int(i in special) for i in token_ids_0]
        return self._template.apply(list(token_ids_0), None if token_ids_1 is None else list(token_ids_1))[2]

    # ------------------------------------------------------------------ encoding
    def __call__(
        self,
        text: str | list[str] | list[tuple[str, str]],
        text_pair: str | list[str] | None = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_length: bool = False,
        add_prefix_space: bool | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """One text, a text pair, or a batch of either (a list of texts, or of ``(text, pair)`` tuples).
        ``verbose`` is transformers' switch for its warnings; hf-lite's go through logging either way."""
        batched = isinstance(text, (list, tuple))
        texts = list(text) if batched else [text]
        pairs = None
        if text_pair is None and batched and texts and all(isinstance(t, (list, tuple)) for t in texts):
            texts, pairs = [t[0] for t in texts], [t[1] for t in texts]
        elif text_pair is not None:
            pairs = list(text_pair) if batched else [text_pair]
            if isinstance(text_pair, (list, tuple)) != batched or len(pairs) != len(texts):
                raise ValueError("text_pair must be one text for one text, or a list as long as the batch")
        if not all(isinstance(t, str) for t in texts + (pairs or [])):
            raise ValueError("text input must be of type `str` (single example) or `list[str]` (batch)")
        padding, truncation, max_length = padding_truncation_strategies(self, padding, truncation, max_length,
                                                                        pad_to_multiple_of)
        ids_a = self._encode_texts(texts, add_prefix_space)
        ids_b = self._encode_texts(pairs, add_prefix_space) if pairs is not None else [None] * len(texts)
        rows, sample = encode_rows(
            self,
            ids_a,
            ids_b,
            add_special_tokens=add_special_tokens,
            truncation=truncation,
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=return_overflowing_tokens,
            side=self.truncation_side,
        )
        return finish_rows(
            self,
            rows,
            batched=batched,
            padding=padding,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_tensors=return_tensors,
            return_attention_mask=return_attention_mask,
            return_token_type_ids=return_token_type_ids,
            return_special_tokens_mask=return_special_tokens_mask,
            return_length=return_length,
            overflow_to_sample=sample if return_overflowing_tokens else None,
            check_length=True,
        )

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        add_prefix_space: bool | None = None,
    ):
        enc = self(
            text,
            text_pair,
            add_special_tokens=add_special_tokens,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            stride=stride,
            padding_side=padding_side,
            return_tensors=return_tensors,
            return_attention_mask=False,
            add_prefix_space=add_prefix_space,
        )
        return enc["input_ids"]

    def tokenize(
        self, text: str, pair: str | None = None, add_special_tokens: bool = False, add_prefix_space: bool | None = None
    ) -> list[str]:
        """Token strings; ``add_prefix_space=True`` tokenizes " " + text, as GPT-2's slow tokenizer does."""
        ids = self.encode(text, pair, add_special_tokens=add_special_tokens, add_prefix_space=add_prefix_space)
        return self.convert_ids_to_tokens(ids)

    def pad(
        self,
        encoded_inputs,
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad already-encoded examples (what data collators call): a dict of lists or a list of dicts. Keys other
        than the model inputs and masks (labels) are passed through unpadded, as in transformers."""
        rows, batched = as_rows(encoded_inputs, self.model_input_names[0])
        padding, _, max_length = padding_truncation_strategies(self, padding, None, max_length, pad_to_multiple_of)
        return finish_rows(
            self,
            rows,
            batched=batched,
            padding=padding,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_tensors=return_tensors,
            return_attention_mask=return_attention_mask,
            return_token_type_ids="token_type_ids" in rows,
            return_special_tokens_mask="special_tokens_mask" in rows,
            return_length=False,
        )

    # ------------------------------------------------------------------ decoding
    def decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None) -> str:
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        for t in token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise ValueError(f"token id {t!r} is not a non-negative int")
        # Ids past the tokenizer (a model vocabulary padded to a multiple of 64, say) decode to nothing, as in the
        # Rust tokenizers transformers uses.
        vocab_size = len(self)
        text = self._decode([t for t in token_ids if t < vocab_size], skip_special_tokens)
        clean = clean_up_tokenization_spaces
        if clean if clean is not None else self.clean_up_tokenization_spaces:
            text = self.clean_up_tokenization(text)
        return text

    def clean_up_tokenization(self, text: str) -> str:
        """English spacing before punctuation and contractions removed (``clean_up_tokenization_spaces``)."""
        for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                     (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
            text = text.replace(a, b)
        return text

    def get_added_vocab(self) -> dict[str, int]:
        """The added tokens (special ones included) by id order, as ``{content: id}``."""
        return {str(token): index for index, token in sorted(self.added_tokens_decoder.items())}

    def batch_decode(self, sequences, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None):
        if isinstance(sequences, torch.Tensor):
            sequences = sequences.tolist()
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    # ------------------------------------------------------------------ chat templates
    def apply_chat_template(
        self,
        conversation,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_dict: bool = True,
        **kwargs,
    ):
        """Render with the Jinja template (extra kwargs are template variables, as in transformers)."""
        rendered, batched = render_conversations(
            conversation,
            chat_template or self.chat_template,
            add_generation_prompt,
            continue_final_message,
            {k: v for k, v in self._special.items() if v is not None},
            kwargs,
        )
        if not tokenize:
            return rendered if batched else rendered[0]
        # The template already wrote the special tokens it wants.
        enc = self(
            rendered if batched else rendered[0],
            add_special_tokens=False,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            return_tensors=return_tensors,
        )
        return enc if return_dict else enc["input_ids"]

    # ------------------------------------------------------------------ saving
    def _tokenizer_config(self) -> dict:
        config = dict(self.init_kwargs)
        config.update({k: v for k, v in self._special.items() if v is not None})
        if self._additional_special_tokens:
            config["additional_special_tokens"] = list(self._additional_special_tokens)
        config.update(
            tokenizer_class=type(self).__name__,
            model_max_length=self.model_max_length,
            padding_side=self.padding_side,
            truncation_side=self.truncation_side,
            clean_up_tokenization_spaces=self.clean_up_tokenization_spaces,
        )
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    def save_pretrained(self, save_directory: str | os.PathLike, legacy_format: bool | None = None,
                        filename_prefix: str | None = None, push_to_hub: bool = False, **kwargs) -> tuple[str, ...]:
        """Write the tokenizer files; the directory changes in one step, other files in it stay. ``push_to_hub``
        commits the files this save changed (``repo_id``, ``commit_message``, ``token``, ``private``... in
        ``kwargs``). The files are always the tokenizer's own format, whatever ``legacy_format`` says."""
        if filename_prefix is not None:
            raise ValueError(f"filename_prefix={filename_prefix!r}: hf-lite writes the tokenizer files unprefixed")
        token = kwargs.get("token")
        hub = self._create_repo(save_directory, push_to_hub, kwargs)
        names = [*self.vocab_files, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE]
        dump = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
        with atomic_save_directory(save_directory, lambda name: name in names) as stage:
            self._save_vocabulary_files(stage)
            atomic_write_text(os.path.join(stage, TOKENIZER_CONFIG_FILE), dump(self._tokenizer_config()))
            atomic_write_text(os.path.join(stage, SPECIAL_TOKENS_MAP_FILE), dump(self.special_tokens_map))
        if push_to_hub:
            self._upload_modified_files(save_directory, token=token, **hub)
        return tuple(os.path.join(os.fspath(save_directory), name) for name in names)

    @classmethod
    def _read_tokenizer_config(cls, directory: str, user_kwargs: dict) -> dict:
        """tokenizer_config.json's keys, overridden by the caller's (which must be ones the tokenizer takes)."""
        cls._check_init_kwargs(user_kwargs)
        path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
        config = {}
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        for key in ("tokenizer_class", "added_tokens_decoder", "auto_map", "name_or_path", "backend", "is_local"):
            config.pop(key, None)
        config.update(user_kwargs)
        return config
