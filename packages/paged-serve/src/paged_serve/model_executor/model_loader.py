"""Build a model from a Hugging Face checkpoint directory (vLLM ``model_loader/``): config.json + safetensors.

The model is built on the meta device (no random initialisation, no memory), materialised on the target device and
dtype, then filled straight from the safetensors files (one file, or shards listed in
``model.safetensors.index.json``). Architectures are looked up by the ``architectures`` field, as vLLM does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from paged_serve._infra import config_checks
from paged_serve.model_executor.layers.rotary_embedding import RotaryEmbedding
from paged_serve.model_executor.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


class ModelRegistry:
    """Architecture name (config.json ``architectures``) -> model class (vLLM ``ModelRegistry``); the other families
    register themselves from ``_compat/model_executor/models/``."""

    models: dict[str, type] = {"LlamaForCausalLM": LlamaForCausalLM, "MistralForCausalLM": LlamaForCausalLM}

    @classmethod
    def register_model(cls, model_arch: str, model_cls: type) -> None:
        cls.models[model_arch] = model_cls

    @classmethod
    def get_supported_archs(cls) -> list[str]:
        return sorted(cls.models)


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_hf_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir!s} has no config.json: not a Hugging Face model directory")
    config = json.loads(path.read_text())
    config_checks.check_hf_config(config)
    return config


def resolve_dtype(dtype: str | torch.dtype, config: dict) -> torch.dtype:
    """vLLM's ``dtype``: 'auto' takes the checkpoint's (``dtype`` / ``torch_dtype`` in config.json), else fp32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype {dtype} not supported; use one of {sorted(_DTYPES)}")
        return dtype
    if dtype == "auto":
        name = config.get("dtype") or config.get("torch_dtype") or "float32"
        return _DTYPES.get(str(name).removeprefix("torch."), torch.float32)
    aliases = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
    name = aliases.get(dtype, dtype)
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def model_class(config: dict):
    for arch in config.get("architectures") or []:
        if arch in ModelRegistry.models:
            return ModelRegistry.models[arch]
    raise ValueError(
        f"architectures {config.get('architectures')} (model_type {config.get('model_type')!r}) not supported; "
        f"supported: {ModelRegistry.get_supported_archs()}"
    )


def iterate_weights(model_dir: str | Path) -> Iterator[tuple[str, object]]:
    """(name, lazy slice) for every tensor of the checkpoint, file by file: a weight loader reads only the part
    its rank keeps (``slice[a:b]``, ``slice[:]`` for all of it)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{model_dir!s} has no model.safetensors or model.safetensors.index.json")
    for name in files:
        with safe_open(str(model_dir / name), framework="pt", device="cpu") as f:
            for key in f.keys():
                yield key, f.get_slice(key)


def get_model(model_dir: str | Path, dtype: torch.dtype, device: torch.device, config: dict | None = None):
    config = config or load_hf_config(model_dir)
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config)
    model = model.to_empty(device=device)
    for module in model.modules():  # non-persistent buffers were never materialised: rebuild them
        if isinstance(module, RotaryEmbedding):
            module.build_cache(device)
    if model.tie_word_embeddings:  # to_empty gave each module its own new tensor
        model.lm_head.weight = model.get_input_embeddings().weight
    model.load_weights(iterate_weights(model_dir))
    model = model.to(dtype).eval()
    logger.info("loaded %s from %s (%s, %s)", cls.__name__, model_dir, dtype, device)
    return model
