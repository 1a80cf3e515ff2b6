"""PreTrainedTokenizerBase: the interface shared by the pure-Python and the Rust-backed tokenizer.

Subclasses provide ``_encode_texts`` (text -> ids without special tokens), ``_decode`` and the vocabulary; this
class does everything transformers users touch: ``__call__`` with padding/truncation/tensors, ``encode``/``decode``,
special and added tokens, the template's special-token prefix/suffix, ``save_pretrained`` and chat templates.
"""

from __future__ import annotations

import abc
import json
import os
from collections import UserDict

import torch

from .chat_template_utils import render_chat
from .tokenization_padding import VERY_LARGE_INTEGER, pad_batch, truncate_ids
from .utils import atomic_write_text

SPECIAL_TOKENS_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
TOKENIZER_FILE = "tokenizer.json"


class BatchEncoding(UserDict):
    """Dict of model inputs (``input_ids``, ``attention_mask``) with attribute access and ``.to(device)``."""

    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError as err:
            raise AttributeError(item) from err

    def to(self, device) -> BatchEncoding:
        self.data = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.data.items()}
        return self


def _content(token) -> str | None:
    if token is None or isinstance(token, str):
        return token
    if isinstance(token, dict):
        return token["content"]
    return str(getattr(token, "content", token))


class PreTrainedTokenizerBase(abc.ABC):
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs):
        self.model_max_length = kwargs.pop("model_max_length", VERY_LARGE_INTEGER) or VERY_LARGE_INTEGER
        self.padding_side = kwargs.pop("padding_side", "right")
        self.truncation_side = kwargs.pop("truncation_side", "right")
        for name, side in (("padding_side", self.padding_side), ("truncation_side", self.truncation_side)):
            if side not in ("left", "right"):
                raise ValueError(f"{name} should be 'left' or 'right', got {side!r}")
        self.chat_template = kwargs.pop("chat_template", None)
        self.clean_up_tokenization_spaces = kwargs.pop("clean_up_tokenization_spaces", False)
        self._special_prefix: list[str] = []
        self._special_suffix: list[str] = []
        self._special: dict[str, str | None] = dict.fromkeys(SPECIAL_TOKENS_ATTRIBUTES)
        self._additional_special_tokens: list[str] = []
        self.init_kwargs = {}
        extra = kwargs.pop("additional_special_tokens", None) or kwargs.pop("extra_special_tokens", None) or []
        for attr in SPECIAL_TOKENS_ATTRIBUTES:
            value = _content(kwargs.pop(attr, None))
            if value is not None:
                self._set_special(attr, value)
        if isinstance(extra, dict):
            extra = list(extra.values())
        for tok in extra:
            self._require_known(_content(tok), "additional_special_tokens")
            self._additional_special_tokens.append(_content(tok))
        self.init_kwargs.update(kwargs)

    # ------------------------------------------------------------------ vocabulary interface
    @abc.abstractmethod
    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
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

    @abc.abstractmethod
    def tokenize(self, text: str, **kwargs) -> list[str]:
        """Token strings for ``text``."""

    def __len__(self) -> int:
        return len(self.get_vocab())

    # ------------------------------------------------------------------ special tokens
    def _require_known(self, token: str, attr: str) -> None:
        if self._token_to_id(token) is None:
            raise ValueError(
                f"{attr}={token!r} is not in the vocabulary nor an added token; add it first with "
                f"tokenizer.add_special_tokens({{{attr!r}: {token!r}}})"
            )

    def _set_special(self, attr: str, token: str) -> None:
        self._require_known(token, attr)
        self._special[attr] = token

    def __getattr__(self, name):
        special = self.__dict__.get("_special", {})
        if name in special:
            return special[name]
        if name.endswith("_token_id") and name[: -len("_id")] in special:
            token = special[name[: -len("_id")]]
            return None if token is None else self._token_to_id(token)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in SPECIAL_TOKENS_ATTRIBUTES and "_special" in self.__dict__:
            if value is None:
                self._special[name] = None
            else:
                self._set_special(name, _content(value))
            return
        super().__setattr__(name, value)

    @property
    def additional_special_tokens(self) -> list[str]:
        return list(self._additional_special_tokens)

    @property
    def special_tokens_map(self) -> dict:
        out = {k: v for k, v in self._special.items() if v is not None}
        if self._additional_special_tokens:
            out["additional_special_tokens"] = list(self._additional_special_tokens)
        return out

    @property
    def all_special_tokens(self) -> list[str]:
        tokens = [v for v in self._special.values() if v is not None] + self._additional_special_tokens
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._token_to_id(t) for t in self.all_special_tokens]

    def add_special_tokens(self, special_tokens_dict: dict, replace_additional_special_tokens: bool = True) -> int:
        """Add (if new) and assign special tokens; keys must be known attributes (like transformers)."""
        allowed = set(SPECIAL_TOKENS_ATTRIBUTES) | {"additional_special_tokens"}
        added = 0
        for key, value in special_tokens_dict.items():
            if key not in allowed:
                raise ValueError(f"Key {key!r} is not a special token attribute; use one of {sorted(allowed)}")
            if key == "additional_special_tokens":
                tokens = [_content(t) for t in value]
                added += self._add_tokens(tokens, special_tokens=True)
                if replace_additional_special_tokens:
                    self._additional_special_tokens = []
                self._additional_special_tokens += [t for t in tokens if t not in self._additional_special_tokens]
            else:
                token = _content(value)
                added += self._add_tokens([token], special_tokens=True)
                self._set_special(key, token)
        return added

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        if isinstance(new_tokens, str) or not isinstance(new_tokens, (list, tuple)):
            new_tokens = [new_tokens]
        return self._add_tokens([_content(t) for t in new_tokens], special_tokens=special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            found = self._token_to_id(tokens)
            if found is None:
                unk = self._special["unk_token"]
                if unk is None:
                    raise KeyError(f"token {tokens!r} is not in the vocabulary and the tokenizer has no unk_token")
                return self._token_to_id(unk)
            return found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        if pair:
            raise ValueError("hf-lite tokenizers encode single sequences (no text pairs)")
        return len(self._special_prefix) + len(self._special_suffix)

    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1=None) -> list[int]:
        if token_ids_1 is not None:
            raise ValueError("hf-lite tokenizers encode single sequences (no text pairs)")
        prefix = [self._token_to_id(t) for t in self._special_prefix]
        suffix = [self._token_to_id(t) for t in self._special_suffix]
        return prefix + list(token_ids_0) + suffix

    # ------------------------------------------------------------------ encoding
    def __call__(
        self,
        text: str | list[str],
        text_pair=None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_attention_mask: bool | None = None,
        **kwargs,
    ) -> BatchEncoding:
        if text_pair is not None:
            raise ValueError("hf-lite tokenizers encode single sequences: text_pair is not supported")
        if kwargs:
            raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")
        batched = isinstance(text, (list, tuple))
        texts = list(text) if batched else [text]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("text input must be of type `str` (single example) or `list[str]` (batch)")
        ids = self._encode_texts(texts)
        ids = [self._truncate(x, truncation, max_length, add_special_tokens) for x in ids]
        if add_special_tokens:
            ids = [self.build_inputs_with_special_tokens(x) for x in ids]
        masks = [[1] * len(x) for x in ids]
        ids, masks = self._pad(ids, masks, padding, max_length, pad_to_multiple_of, padding_side)
        data = {"input_ids": ids}
        if return_attention_mask is not False:
            data["attention_mask"] = masks
        if return_tensors is not None:
            if return_tensors != "pt":
                raise ValueError(f"return_tensors={return_tensors!r}: hf-lite returns 'pt' tensors or lists")
            if len({len(x) for x in ids}) > 1:
                raise ValueError(
                    "Unable to create tensor, you should probably activate padding with 'padding=True' to have "
                    "batched tensors with the same length."
                )
            data = {k: torch.tensor(v, dtype=torch.long) for k, v in data.items()}
            if not batched:
                return BatchEncoding(data)
        elif not batched:
            data = {k: v[0] for k, v in data.items()}
        return BatchEncoding(data)

    def _truncate(self, ids, truncation, max_length, add_special_tokens) -> list[int]:
        n_special = self.num_special_tokens_to_add() if add_special_tokens else 0
        limit = self.model_max_length if max_length is None else max_length
        return truncate_ids(ids, truncation, limit, n_special, self.truncation_side)

    def _pad(self, ids, masks, padding, max_length, pad_to_multiple_of, padding_side):
        target = self.model_max_length if max_length is None else max_length
        return pad_batch(ids, masks, padding, target, pad_to_multiple_of, padding_side or self.padding_side,
                         self.pad_token_id)

    def encode(
        self, text: str, add_special_tokens: bool = True, truncation=None, max_length=None, return_tensors=None,
        **kwargs,
    ):
        enc = self(text, add_special_tokens=add_special_tokens, truncation=truncation, max_length=max_length,
                    return_tensors=return_tensors, return_attention_mask=False, **kwargs)
        return enc["input_ids"]

    # ------------------------------------------------------------------ decoding
    def decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None, **kwargs) -> str:
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
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def batch_decode(self, sequences, skip_special_tokens: bool = False, **kwargs) -> list[str]:
        if isinstance(sequences, torch.Tensor):
            sequences = sequences.tolist()
        return [self.decode(s, skip_special_tokens=skip_special_tokens, **kwargs) for s in sequences]

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
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("Cannot use apply_chat_template because this tokenizer does not have a chat template.")
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        conversations = conversation if batched else [conversation]
        special = {k: v for k, v in self._special.items() if v is not None}
        rendered = [
            render_chat(c, template, add_generation_prompt, continue_final_message, **special, **kwargs)
            for c in conversations
        ]
        if not tokenize:
            return rendered if batched else rendered[0]
        # The template already wrote the special tokens it wants.
        enc = self(rendered if batched else rendered[0], add_special_tokens=False, padding=padding,
                   truncation=truncation, max_length=max_length, return_tensors=return_tensors)
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

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> tuple[str, ...]:
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise ValueError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        files = self._save_vocabulary_files(save_directory)
        dump = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
        atomic_write_text(os.path.join(save_directory, TOKENIZER_CONFIG_FILE), dump(self._tokenizer_config()))
        atomic_write_text(os.path.join(save_directory, SPECIAL_TOKENS_MAP_FILE), dump(self.special_tokens_map))
        return tuple(os.path.join(save_directory, f) for f in [*files, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE])

    @staticmethod
    def _read_tokenizer_config(directory: str) -> dict:
        path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
        if not os.path.isfile(path):
            return {}
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        for key in ("tokenizer_class", "added_tokens_decoder", "auto_map", "name_or_path"):
            config.pop(key, None)
        return config

    @staticmethod
    def _template_specials(post_processor: dict | None) -> tuple[list[str], list[str]]:
        """Special tokens a ``TemplateProcessing`` post-processor puts around a single sequence."""
        if not post_processor or post_processor.get("type") != "TemplateProcessing":
            return [], []
        prefix, suffix, seen_sequence = [], [], False
        for piece in post_processor.get("single", []):
            if "Sequence" in piece:
                seen_sequence = True
            elif "SpecialToken" in piece:
                (suffix if seen_sequence else prefix).append(piece["SpecialToken"]["id"])
        return prefix, suffix
