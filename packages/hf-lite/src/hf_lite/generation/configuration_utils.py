"""GenerationConfig: decoding parameters and their ``generation_config.json`` (transformers' generation config)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from .._infra.atomic_io import atomic_write_text
from .._infra.hub import PushToHubMixin, cached_file, pop_hub_kwargs

GENERATION_CONFIG_NAME = "generation_config.json"

_DEFAULTS: dict[str, Any] = {
    # length
    "max_length": 20, "max_new_tokens": None, "min_length": 0, "min_new_tokens": None, "early_stopping": False,
    "max_time": None, "stop_strings": None,
    # strategy
    "do_sample": False, "num_beams": 1, "use_cache": True,
    # logits manipulation
    "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0, "length_penalty": 1.0,
    "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None, "remove_invalid_values": False,
    # output
    "num_return_sequences": 1, "output_scores": False, "return_dict_in_generate": False,
    # special tokens
    "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}


class GenerationConfig(PushToHubMixin):
    """Holds every ``generate`` knob; unknown keys are kept so a transformers-written file round-trips."""

    def __init__(self, **kwargs):
        for key, value in _DEFAULTS.items():
            setattr(self, key, copy.deepcopy(kwargs.pop(key, value)))
        kwargs.pop("transformers_version", None)
        kwargs.pop("_from_model_config", None)
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.validate()

    def validate(self) -> None:
        """Reject values that cannot work, naming them (transformers raises on the same ones)."""

        def positive_int(name, allow_none=False):
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"`{name}` has to be a strictly positive integer, but is {value!r}")

        positive_int("num_beams")
        positive_int("num_return_sequences")
        positive_int("max_new_tokens", allow_none=True)
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length <= 0):
            raise ValueError(f"`max_length` has to be a strictly positive integer, but is {self.max_length!r}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"`early_stopping` must be True, False or 'never', got {self.early_stopping!r}")
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
            raise ValueError(
                f"Greedy methods without beam search do not support `num_return_sequences` different than 1 "
                f"(got {self.num_return_sequences})."
            )
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise ValueError(
                f"`num_return_sequences` ({self.num_return_sequences}) has to be smaller or equal to `num_beams` "
                f"({self.num_beams})."
            )
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"`temperature` (={self.temperature}) has to be a strictly positive float")

    def update(self, **kwargs) -> dict[str, Any]:
        """Set known attributes, return the kwargs that are not generation parameters (model inputs)."""
        unused = {}
        for key, value in kwargs.items():
            if hasattr(self, key):
                setattr(self, key, value)
            else:
                unused[key] = value
        self.validate()
        return unused

    def to_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in self.__dict__.items() if not k.startswith("_")}

    def to_diff_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in _DEFAULTS or _DEFAULTS[k] != v}

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps(self.to_diff_dict() if use_diff else self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __eq__(self, other) -> bool:
        return isinstance(other, GenerationConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"GenerationConfig {self.to_json_string()}"

    def save_pretrained(self, save_directory: str | os.PathLike, config_file_name: str | None = None) -> None:
        os.makedirs(save_directory, exist_ok=True)
        path = os.path.join(save_directory, config_file_name or GENERATION_CONFIG_NAME)
        atomic_write_text(path, self.to_json_string())

    @classmethod
    def from_pretrained(cls, pretrained_model_name: str | os.PathLike, config_file_name: str | None = None,
                        subfolder: str = "", **kwargs):
        """generation_config.json of a local directory or of a hub repo (``_infra/hub.py``), or a JSON file; the
        other kwargs override its keys."""
        download, _ = pop_hub_kwargs(kwargs)
        path, name = os.fspath(pretrained_model_name), config_file_name or GENERATION_CONFIG_NAME
        file = path if os.path.isfile(path) else cached_file(path, name, subfolder=subfolder, **download)
        with open(file, encoding="utf-8") as f:
            config_dict = json.load(f)
        config_dict.update(kwargs)
        return cls(**config_dict)

    @classmethod
    def from_model_config(cls, model_config) -> GenerationConfig:
        """Special tokens (and any generation keys) from a model config, as transformers does."""
        config_dict = {key: getattr(model_config, key,
                                    None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
        for key in _DEFAULTS:
            if key not in config_dict and key in model_config.__dict__:
                config_dict[key] = getattr(model_config, key)
        config_dict.pop("use_cache", None)
        return cls(**config_dict)
