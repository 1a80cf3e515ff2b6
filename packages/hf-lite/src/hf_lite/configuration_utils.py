"""PretrainedConfig: a model's hyper-parameters and their config.json (transformers' ``configuration_utils``)."""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

from .utils import atomic_write_text

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"


class PretrainedConfig:
    """Base class of every model configuration.

    Like transformers, every keyword becomes an attribute; keys a subclass does not know are kept (and saved back), so
    a config.json written by a newer library survives a load/save round trip. ``attribute_map`` lets a subclass expose
    canonical names (``hidden_size``) for its historical ones (GPT-2's ``n_embd``).
    """

    model_type: str = ""
    attribute_map: dict[str, str] = {}
    # Attributes derived at init time that must not be written to config.json.
    _derived_attributes: tuple[str, ...] = ()

    def __setattr__(self, key, value):
        key = type(self).attribute_map.get(key, key)
        super().__setattr__(key, value)

    def __getattr__(self, key):
        # Only reached when normal lookup fails: resolve an aliased name.
        amap = type(self).attribute_map
        if key in amap:
            return getattr(self, amap[key])
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def __init__(
        self,
        *,
        vocab_size: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        architectures: list[str] | None = None,
        torch_dtype: str | None = None,
        is_encoder_decoder: bool = False,
        **kwargs,
    ):
        if vocab_size is not None:
            self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        self.architectures = architectures
        # transformers 5 writes "dtype", 4.x wrote "torch_dtype"; accept both.
        self.torch_dtype = kwargs.pop("dtype", torch_dtype)
        self.is_encoder_decoder = is_encoder_decoder
        kwargs.pop("transformers_version", None)
        kwargs.pop("model_type", None)
        for key, value in kwargs.items():
            try:
                setattr(self, key, value)
            except AttributeError as err:
                raise AttributeError(f"can't set {key}={value!r} on {type(self).__name__}") from err

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        out = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if not k.startswith("_")}
        for key in self._derived_attributes:
            out.pop(key, None)
        out["model_type"] = self.model_type
        dtype = out.pop("torch_dtype", None)
        if dtype is not None:
            out["dtype"] = str(dtype).replace("torch.", "")
        return dict(sorted(out.items()))

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, self.to_json_string())

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"

    def __eq__(self, other) -> bool:
        return isinstance(other, PretrainedConfig) and self.to_dict() == other.to_dict()

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> PretrainedConfig:
        merged = dict(config_dict)
        merged.update(kwargs)
        return cls(**merged)

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path: str | os.PathLike) -> dict[str, Any]:
        path = os.fspath(pretrained_model_name_or_path)
        file = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise OSError(f"{path!r} does not contain a file named {CONFIG_NAME} (hf-lite loads local dirs only)")
        try:
            with open(file, encoding="utf-8") as f:
                return json.load(f)
        except json.JSONDecodeError as err:
            raise OSError(f"{file} is not valid JSON: {err}") from err

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> PretrainedConfig:
        config_dict = cls.get_config_dict(pretrained_model_name_or_path)
        found = config_dict.get("model_type")
        if cls.model_type and found and found != cls.model_type:
            logger.warning("Loading a %r config into %s (model_type %r)", found, cls.__name__, cls.model_type)
        return cls.from_dict(config_dict, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        if os.path.isfile(save_directory):
            raise AssertionError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        self.to_json_file(os.path.join(save_directory, CONFIG_NAME))

    # ------------------------------------------------------------------ helpers
    def update(self, config_dict: dict[str, Any]) -> None:
        for key, value in config_dict.items():
            setattr(self, key, value)


# transformers 5 renamed the class; keep both spellings importable.
PreTrainedConfig = PretrainedConfig
