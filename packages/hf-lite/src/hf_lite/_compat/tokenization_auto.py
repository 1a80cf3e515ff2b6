"""AutoTokenizer: tokenizer_config.json's ``tokenizer_class`` / config ``model_type`` -> tokenizer class."""

from __future__ import annotations

import json
import os

from ..models.auto.configuration_auto import CONFIG_MAPPING
from .tokenization_gpt2 import GPT2Tokenizer
from .tokenization_utils_base import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, tokenizer_directory
from .tokenization_utils_fast import PreTrainedTokenizerFast

# model_type -> (slow class, fast class), like transformers' TOKENIZER_MAPPING.
TOKENIZER_MAPPING: dict[str, tuple[type | None, type | None]] = {
    "gpt2": (GPT2Tokenizer, PreTrainedTokenizerFast),
    "llama": (None, PreTrainedTokenizerFast),
}
_BY_NAME: dict[str, type] = {
    "GPT2Tokenizer": GPT2Tokenizer,
    "GPT2TokenizerFast": PreTrainedTokenizerFast,
    "PreTrainedTokenizerFast": PreTrainedTokenizerFast,
    "LlamaTokenizerFast": PreTrainedTokenizerFast,
    # transformers 5 writes this for a tokenizer.json without a model-specific class.
    "TokenizersBackend": PreTrainedTokenizerFast,
}


class AutoTokenizer:
    def __init__(self):
        raise OSError("AutoTokenizer is designed to be instantiated using `AutoTokenizer.from_pretrained(path)`.")

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, use_fast: bool = True, subfolder: str = "", **kwargs
    ):
        directory = tokenizer_directory(pretrained_model_name_or_path, subfolder, kwargs)
        if not os.path.isdir(directory):
            raise OSError(f"{directory!r} is not a directory")
        has_json = os.path.isfile(os.path.join(directory, TOKENIZER_FILE))
        slow, fast = cls._classes_for(directory)
        if use_fast and fast is not None and has_json:
            return fast.from_pretrained(directory, **kwargs)
        if slow is not None:
            return slow.from_pretrained(directory, **kwargs)
        if fast is not None and has_json:
            return fast.from_pretrained(directory, **kwargs)
        raise ValueError(f"{directory!r}: no tokenizer class can load it (missing {TOKENIZER_FILE}?)")

    @staticmethod
    def _classes_for(directory: str) -> tuple[type | None, type | None]:
        config_path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
        name = None
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                name = json.load(f).get("tokenizer_class")
        for slow, fast in TOKENIZER_MAPPING.values():
            # Like transformers: naming either class of a pair lets `use_fast` choose between them.
            if name is not None and name in {getattr(slow, "__name__", None), getattr(fast, "__name__", None)}:
                return slow, fast
        if name in _BY_NAME:
            klass = _BY_NAME[name]
            return (klass, None) if klass is GPT2Tokenizer else (GPT2Tokenizer, klass)
        model_config = os.path.join(directory, "config.json")
        if os.path.isfile(model_config):
            with open(model_config, encoding="utf-8") as f:
                model_type = json.load(f).get("model_type")
            if model_type in TOKENIZER_MAPPING:
                return TOKENIZER_MAPPING[model_type]
        if name is not None:
            raise ValueError(f"Tokenizer class {name!r} does not exist or is not registered (AutoTokenizer.register)")
        return GPT2Tokenizer, PreTrainedTokenizerFast

    @staticmethod
    def register(config_class, tokenizer_class=None, slow_tokenizer_class=None, fast_tokenizer_class=None,
                 exist_ok: bool = False) -> None:
        if tokenizer_class is not None:  # transformers 5: one class, sorted into the slow or the fast slot
            is_fast = issubclass(tokenizer_class, PreTrainedTokenizerFast)
            fast_tokenizer_class = tokenizer_class if is_fast else fast_tokenizer_class
            slow_tokenizer_class = slow_tokenizer_class if is_fast else tokenizer_class
        if slow_tokenizer_class is None and fast_tokenizer_class is None:
            raise ValueError("You need to pass either a `slow_tokenizer_class` or a `fast_tokenizer_class`")
        model_type = getattr(config_class, "model_type", None)
        if not model_type or model_type not in CONFIG_MAPPING:
            raise ValueError(f"register the config first: AutoConfig.register({model_type!r}, {config_class})")
        if model_type in TOKENIZER_MAPPING and not exist_ok:
            old_slow, old_fast = TOKENIZER_MAPPING[model_type]
            slow_tokenizer_class = slow_tokenizer_class or old_slow
            fast_tokenizer_class = fast_tokenizer_class or old_fast
        TOKENIZER_MAPPING[model_type] = (slow_tokenizer_class, fast_tokenizer_class)
        for klass in (slow_tokenizer_class, fast_tokenizer_class):
            if klass is not None:
                _BY_NAME[klass.__name__] = klass
