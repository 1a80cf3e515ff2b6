"""PretrainedConfig: a model's hyper-parameters and their config.json (transformers' ``configuration_utils``)."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
from typing import Any

import torch

from ._infra.atomic_io import atomic_write_text
from ._infra.hub import PushToHubMixin, cached_file, check_remote_code, pop_hub_kwargs

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"

# What ``PretrainedConfig.__init__`` sets, read by the library; a subclass whose ``__init__`` never calls it (as
# transformers' ``NoSuperInitConfig`` test) still answers with these defaults.
_BASE_DEFAULTS: dict[str, Any] = {
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "tie_word_embeddings": True, "use_cache": True,
    "architectures": None, "dtype": None, "is_encoder_decoder": False, "output_hidden_states": False,
    "output_attentions": False, "return_dict": True, "chunk_size_feed_forward": 0, "problem_type": None,
}

# transformers' defaults of what classification heads read, answered while unset and written once set.
_UNSET_DEFAULTS: dict[str, Any] = {"id2label": {0: "LABEL_0", 1: "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
                                   "finetuning_task": None}


def to_torch_dtype(dtype) -> torch.dtype | None:
    """``"bfloat16"`` / ``"torch.bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; anything else is an error."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None) if isinstance(dtype, str) else None
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16', torch.float16)")
    return resolved


class PretrainedConfig(PushToHubMixin):
    """Base class of every model configuration.

    Like transformers, every keyword becomes an attribute; keys a subclass does not know are kept (and saved back), so
    a config.json written by a newer library survives a load/save round trip. ``attribute_map`` lets a subclass expose
    canonical names (``hidden_size``) for its historical ones (GPT-2's ``n_embd``), in keywords too.
    """

    model_type: str = ""
    attribute_map: dict[str, str] = {}
    # Attributes derived at init time that must not be written to config.json.
    _derived_attributes: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kw):
            # GPT2Config(hidden_size=16) must set n_embd: the subclass assigns its own names after super().__init__.
            for alias, name in type(self).attribute_map.items():
                if alias in kw and name not in kw:
                    kw[name] = kw.pop(alias)
            init(self, *args, **kw)

        cls.__init__ = __init__

    def __setattr__(self, key, value):
        key = "dtype" if key == "torch_dtype" else type(self).attribute_map.get(key, key)
        if key == "dtype":
            value = to_torch_dtype(value)
        if key == "id2label" and value is not None:  # JSON keys are strings
            value = {int(k): v for k, v in value.items()}
        super().__setattr__(key, value)

    @property
    def num_labels(self) -> int:
        """Classification heads' output count: ``len(id2label)`` (2 by default, as in transformers)."""
        return len(self.id2label)

    @num_labels.setter
    def num_labels(self, num_labels: int) -> None:
        if self.__dict__.get("id2label") is None or len(self.id2label) != num_labels:
            self.id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
            self.label2id = {label: i for i, label in self.id2label.items()}

    def __getattr__(self, key):
        # Only reached when normal lookup fails: resolve an aliased name (torch_dtype is transformers 4's dtype).
        amap = type(self).attribute_map
        if key in amap:
            return getattr(self, amap[key])
        if key == "torch_dtype":
            return self.dtype
        if key in _BASE_DEFAULTS and not key.startswith("__"):
            return copy.copy(_BASE_DEFAULTS[key])
        if key in _UNSET_DEFAULTS:
            return copy.deepcopy(_UNSET_DEFAULTS[key])
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def __init__(self, *, vocab_size: int | None = None, torch_dtype: str | torch.dtype | None = None, **kwargs):
        """Every keyword becomes an attribute; the base ones default as ``_BASE_DEFAULTS`` says."""
        if vocab_size is not None:
            self.vocab_size = vocab_size
        for key, default in _BASE_DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, copy.copy(default)))
        if self.dtype is None:  # transformers 5 writes "dtype", 4.x wrote "torch_dtype"; both load as a torch.dtype
            self.dtype = torch_dtype
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
        if out.get("dtype") is not None:
            out["dtype"] = str(out["dtype"]).removeprefix("torch.")
        return dict(sorted(out.items()))

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, json_file_path: str | os.PathLike) -> None:
        atomic_write_text(json_file_path, self.to_json_string())

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"

    def __eq__(self, other) -> bool:
        return isinstance(other, PretrainedConfig) and self.to_dict() == other.to_dict()

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], return_unused_kwargs: bool = False, **kwargs):
        """Build from a config.json dict; ``kwargs`` naming config attributes override it (transformers).

        Other kwargs are returned with ``return_unused_kwargs=True`` (``from_pretrained`` hands them to the model's
        ``__init__``) and are an error otherwise: transformers drops them silently.
        """
        config = cls(**config_dict)
        known = {cls.attribute_map.get(k, k): v for k, v in kwargs.items() if hasattr(config, k)}
        unused = {k: v for k, v in kwargs.items() if not hasattr(config, k)}
        if known:  # rebuilt rather than set, so derived values (rope_parameters) and checks follow the override
            config = cls(**{**config_dict, **known})
        if return_unused_kwargs:
            return config, unused
        if unused:
            raise ValueError(f"{sorted(unused)} are not attributes of {cls.__name__}; nothing uses them")
        return config

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "",
                        **download) -> dict[str, Any]:
        """config.json of a local directory or of a hub repo (fetched by ``_infra/hub.py``), or a JSON file."""
        path = os.fspath(pretrained_model_name_or_path)
        file = path if os.path.isfile(path) else cached_file(path, CONFIG_NAME, subfolder=subfolder, **download)
        try:
            with open(file, encoding="utf-8") as f:
                return json.load(f)
        except json.JSONDecodeError as err:
            raise OSError(f"{file} is not valid JSON: {err}") from err

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "",
                        return_unused_kwargs: bool = False, **kwargs):
        download, trust_remote_code = pop_hub_kwargs(kwargs)
        config_dict = cls.get_config_dict(pretrained_model_name_or_path, subfolder=subfolder, **download)
        check_remote_code(config_dict, trust_remote_code, pretrained_model_name_or_path)
        found = config_dict.get("model_type")
        if cls.model_type and found and found != cls.model_type:
            logger.warning("Loading a %r config into %s (model_type %r)", found, cls.__name__, cls.model_type)
        return cls.from_dict(config_dict, return_unused_kwargs=return_unused_kwargs, **kwargs)

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
