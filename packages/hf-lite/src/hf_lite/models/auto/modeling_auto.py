"""AutoModel / AutoModelForCausalLM: config class -> model class, through registries users can extend."""

from __future__ import annotations

import os

from ..._infra.hub import check_remote_code, pop_hub_kwargs
from ...configuration_utils import PretrainedConfig
from ..gpt2.configuration_gpt2 import GPT2Config
from ..gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaForCausalLM, LlamaModel
from .configuration_auto import AutoConfig

MODEL_MAPPING: dict[type, type] = {GPT2Config: GPT2Model, LlamaConfig: LlamaModel}
MODEL_FOR_CAUSAL_LM_MAPPING: dict[type, type] = {GPT2Config: GPT2LMHeadModel, LlamaConfig: LlamaForCausalLM}


class _BaseAutoModelClass:
    _model_mapping: dict[type, type] = {}

    def __init__(self, *args, **kwargs):
        raise OSError(f"{type(self).__name__} is designed to be instantiated with `from_pretrained` or `from_config`.")

    @classmethod
    def _model_class(cls, config: PretrainedConfig) -> type:
        for config_class in type(config).__mro__:
            if config_class in cls._model_mapping:
                return cls._model_mapping[config_class]
        known = ", ".join(c.__name__ for c in cls._model_mapping)
        raise ValueError(f"Unrecognized configuration class {type(config).__name__} for {cls.__name__}; known: {known}")

    @classmethod
    def from_config(cls, config: PretrainedConfig, **kwargs):
        """A freshly initialised model; ``dtype=`` builds it in that dtype (transformers' ``_from_config``)."""
        check_remote_code(config.to_dict(), pop_hub_kwargs(kwargs)[1], type(config).__name__)
        return cls._model_class(config)._from_config(config, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args, **kwargs):
        config = kwargs.pop("config", None)
        download, trust_remote_code = pop_hub_kwargs(kwargs)  # cache_dir, revision, token... reach both loads
        if config is None:
            load_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _LOAD_KWARGS}
            # Config attributes override config.json; what is left goes to the model's __init__ (transformers).
            config, kwargs = AutoConfig.from_pretrained(pretrained_model_name_or_path,
                                                        subfolder=load_kwargs.get("subfolder", ""),
                                                        return_unused_kwargs=True, trust_remote_code=trust_remote_code,
                                                        **download, **kwargs)
            kwargs.update(load_kwargs)
        model_class = cls._model_class(config)
        return model_class.from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **download,
                                           **kwargs)

    @classmethod
    def register(cls, config_class: type, model_class: type, exist_ok: bool = False) -> None:
        if getattr(model_class, "config_class", None) is not None and model_class.config_class is not config_class:
            raise ValueError(
                f"The model class you are passing has a `config_class` attribute ({model_class.config_class}) that is "
                f"not consistent with the config class you passed ({config_class})."
            )
        if config_class in cls._model_mapping and not exist_ok:
            raise ValueError(f"{config_class.__name__} is already registered in {cls.__name__}.")
        cls._model_mapping[config_class] = model_class


_LOAD_KWARGS = {"torch_dtype", "dtype", "device_map", "output_loading_info", "ignore_mismatched_sizes", "subfolder",
                "variant", "use_safetensors"}


class AutoModel(_BaseAutoModelClass):
    _model_mapping = MODEL_MAPPING


class AutoModelForCausalLM(_BaseAutoModelClass):
    _model_mapping = MODEL_FOR_CAUSAL_LM_MAPPING
