"""AutoConfig: ``model_type`` in config.json -> config class, through a registry users can extend."""

from __future__ import annotations

import os

from ..._infra.hub import check_remote_code, pop_hub_kwargs
from ...configuration_utils import PretrainedConfig
from ..gpt2.configuration_gpt2 import GPT2Config
from ..llama.configuration_llama import LlamaConfig

CONFIG_MAPPING: dict[str, type[PretrainedConfig]] = {"gpt2": GPT2Config, "llama": LlamaConfig}


class AutoConfig:
    """Not instantiable: use ``from_pretrained``, ``for_model`` or ``register``."""

    def __init__(self):
        raise OSError("AutoConfig is designed to be instantiated using `AutoConfig.from_pretrained(path)`.")

    @staticmethod
    def _lookup(model_type: str) -> type[PretrainedConfig]:
        if model_type not in CONFIG_MAPPING:
            raise ValueError(f"Unrecognized model_type {model_type!r}. Should be one of {sorted(CONFIG_MAPPING)} "
                             "(or register it with AutoConfig.register).")
        return CONFIG_MAPPING[model_type]

    @classmethod
    def for_model(cls, model_type: str, *args, **kwargs) -> PretrainedConfig:
        return cls._lookup(model_type)(*args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "",
                        return_unused_kwargs: bool = False, **kwargs):
        download, trust_remote_code = pop_hub_kwargs(kwargs)
        config_dict = PretrainedConfig.get_config_dict(pretrained_model_name_or_path, subfolder=subfolder, **download)
        check_remote_code(config_dict, trust_remote_code, pretrained_model_name_or_path)
        if "model_type" not in config_dict:
            raise ValueError(f"{pretrained_model_name_or_path}: config.json has no `model_type` key")
        config_class = cls._lookup(config_dict["model_type"])
        return config_class.from_dict(config_dict, return_unused_kwargs=return_unused_kwargs, **kwargs)

    @staticmethod
    def register(model_type: str, config: type[PretrainedConfig], exist_ok: bool = False) -> None:
        if getattr(config, "model_type", None) != model_type:
            raise ValueError(
                f"The config you are passing has a `model_type` attribute ({config.model_type!r}) that is not "
                f"consistent with the model type you passed ({model_type!r})."
            )
        if model_type in CONFIG_MAPPING and not exist_ok:
            raise ValueError(f"{model_type!r} is already used by a config, pick another name.")
        CONFIG_MAPPING[model_type] = config
