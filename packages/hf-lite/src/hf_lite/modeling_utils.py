"""PreTrainedModel: weight init, tied embeddings, the checkpoint-directory contract (transformers' modeling_utils).

``from_pretrained`` reads ``config.json`` + safetensors (single file or shards with an index), checks every tensor's
shape against the model *before* copying anything (so nothing is half-loaded), and reports missing/unexpected keys
like transformers does. ``save_pretrained`` writes the same layout transformers reads.
"""

from __future__ import annotations

import logging
import os
import re

import torch
from torch import nn
from tqdm.auto import tqdm

from .checkpoint_utils import CheckpointError, load_safetensors_file, resolve_weight_files, save_state_dict
from .configuration_utils import PretrainedConfig
from .generation.configuration_utils import GENERATION_CONFIG_NAME, GenerationConfig

logger = logging.getLogger(__name__)


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    name = str(dtype).replace("torch.", "")
    resolved = getattr(torch, name, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16', torch.float16)")
    return resolved


def _resolve_device(device_map):
    if device_map is None:
        return None
    if device_map == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, dict):
        devices = set(device_map.values())
        if len(devices) != 1:
            raise ValueError(f"device_map={device_map!r}: hf-lite places a model on one device only")
        device_map = devices.pop()
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    return torch.device(device_map)


class PreTrainedModel(nn.Module):
    """Base of every model. Subclasses set ``config_class``, ``base_model_prefix`` and ``_init_weights``."""

    config_class: type[PretrainedConfig] = PretrainedConfig
    base_model_prefix: str = ""
    main_input_name = "input_ids"
    # {target: source} as transformers 5 spells it: the target parameter is the source parameter when tied.
    _tied_weights_keys: dict[str, str] = {}
    _keys_to_ignore_on_load_unexpected: list[str] = []

    def __init__(self, config: PretrainedConfig, *inputs, **kwargs):
        super().__init__()
        if not isinstance(config, PretrainedConfig):
            raise TypeError(f"{type(self).__name__} expects a PretrainedConfig, got {type(config).__name__}")
        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config) if self.can_generate() else None

    @classmethod
    def can_generate(cls) -> bool:
        return any(base.__name__ == "GenerationMixin" for base in cls.__mro__)

    # ------------------------------------------------------------------ init and tying
    def _init_weights(self, module: nn.Module) -> None:
        """Per-module initialisation; models override it."""

    def post_init(self) -> None:
        self.apply(self._init_weights)
        self.tie_weights()

    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    def get_input_embeddings(self) -> nn.Embedding:
        base = self.base_model
        if base is self:
            raise AttributeError(f"{type(self).__name__} has no base model: override get_input_embeddings")
        return base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        base = self.base_model
        if base is self:
            raise AttributeError(f"{type(self).__name__} has no base model: override set_input_embeddings")
        base.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        return getattr(self, "lm_head", None)

    def tie_weights(self) -> None:
        output = self.get_output_embeddings()
        if output is not None and getattr(self.config, "tie_word_embeddings", False):
            output.weight = self.get_input_embeddings().weight

    def _tied_keys(self) -> set[str]:
        if not getattr(self.config, "tie_word_embeddings", False):
            return set()
        return set(self._tied_weights_keys)

    # ------------------------------------------------------------------ introspection
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters counted once even when tied (``nn.Module.parameters`` deduplicates shared tensors)."""
        skip = set()
        if exclude_embeddings:
            skip = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        return sum(
            p.numel() for p in self.parameters() if id(p) not in skip and (p.requires_grad or not only_trainable)
        )

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Grow/shrink the vocabulary; new rows start at the mean of the old ones (transformers' ``mean_resizing``)."""
        old = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return old
        new_num_tokens = old.num_embeddings if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0:
                raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive int")
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        if new_num_tokens <= 0:
            raise ValueError(f"new_num_tokens={new_num_tokens} must be positive")
        new = nn.Embedding(new_num_tokens, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype)
        self._resize_rows(old.weight, new.weight, mean_resizing)
        self.set_input_embeddings(new)
        output = self.get_output_embeddings()
        if output is not None and not getattr(self.config, "tie_word_embeddings", False):
            new_head = nn.Linear(output.in_features, new_num_tokens, bias=output.bias is not None)
            new_head.to(device=output.weight.device, dtype=output.weight.dtype)
            self._resize_rows(output.weight, new_head.weight, mean_resizing)
            if output.bias is not None:
                with torch.no_grad():
                    n = min(output.bias.shape[0], new_num_tokens)
                    new_head.bias.zero_()
                    new_head.bias[:n] = output.bias[:n]
            self.lm_head = new_head
        self.config.vocab_size = new_num_tokens
        self.tie_weights()
        return self.get_input_embeddings()

    def _resize_rows(self, old_w: torch.Tensor, new_w: torch.Tensor, mean_resizing: bool) -> None:
        with torch.no_grad():
            n = min(old_w.shape[0], new_w.shape[0])
            if mean_resizing:
                new_w.copy_(old_w.float().mean(0, keepdim=True).to(new_w.dtype).expand_as(new_w))
            else:
                std = getattr(self.config, "initializer_range", 0.02)
                new_w.normal_(0.0, std)
            new_w[:n] = old_w[:n]

    # ------------------------------------------------------------------ saving
    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        state_dict: dict[str, torch.Tensor] | None = None,
        max_shard_size: int | str = "5GB",
        safe_serialization: bool = True,
        **kwargs,
    ) -> None:
        if not safe_serialization:
            raise ValueError("hf-lite writes safetensors only (safe_serialization=False is not supported)")
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise AssertionError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        self.config.architectures = [type(self).__name__]
        self.config.torch_dtype = str(self.dtype).replace("torch.", "")
        self.config.save_pretrained(save_directory)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(save_directory)
        if state_dict is None:
            state_dict = self.state_dict()
        # Tied copies are not written: the loader re-ties them (what transformers does).
        state_dict = {k: v for k, v in state_dict.items() if k not in self._tied_keys()}
        save_state_dict(state_dict, save_directory, max_shard_size=max_shard_size)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args,
        config: PretrainedConfig | None = None,
        torch_dtype=None,
        dtype=None,
        device_map=None,
        output_loading_info: bool = False,
        ignore_mismatched_sizes: bool = False,
        **kwargs,
    ):
        path = os.fspath(pretrained_model_name_or_path)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a local directory (hf-lite does not download from a hub)")
        if config is None:
            config = cls.config_class.from_pretrained(path, **kwargs)
        elif kwargs:
            config.update(kwargs)
        files = resolve_weight_files(path)
        requested = _resolve_dtype(dtype if dtype is not None else torch_dtype) or "auto"
        model = cls(config, *model_args)
        model.eval()
        checkpoint = model._read_checkpoint(files, ignore_mismatched_sizes)
        if requested == "auto":
            floats = [t.dtype for t in checkpoint["tensors"].values() if t.is_floating_point()]
            requested = floats[0] if floats else torch.get_default_dtype()
        model.to(dtype=requested)
        with torch.no_grad():
            params = dict(model.state_dict(keep_vars=True))
            for key, tensor in checkpoint["tensors"].items():
                params[key].copy_(tensor)
        model.tie_weights()
        device = _resolve_device(device_map)
        if device is not None:
            model.to(device)
        gen_file = os.path.join(path, GENERATION_CONFIG_NAME)
        if model.can_generate() and os.path.isfile(gen_file):
            model.generation_config = GenerationConfig.from_pretrained(path)
        info = {k: checkpoint[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        info["error_msgs"] = []
        model._log_loading_info(path, info)
        return (model, info) if output_loading_info else model

    def _checkpoint_key_mapper(self, checkpoint_keys: list[str]):
        """Translate checkpoint keys to ours: add or strip ``base_model_prefix`` (base <-> head model loading)."""
        prefix = self.base_model_prefix
        own = set(self.state_dict())
        has_prefix_in_model = any(k.startswith(prefix + ".") for k in own) if prefix else False
        has_prefix_in_ckpt = any(k.startswith(prefix + ".") for k in checkpoint_keys) if prefix else False
        if has_prefix_in_model and not has_prefix_in_ckpt:
            return lambda k: f"{prefix}.{k}"
        if not has_prefix_in_model and has_prefix_in_ckpt:
            return lambda k: k[len(prefix) + 1 :] if k.startswith(prefix + ".") else k
        return lambda k: k

    def _read_checkpoint(self, files: dict[str, list[str]], ignore_mismatched_sizes: bool) -> dict:
        expected = self.state_dict()
        all_keys = [k for keys in files.values() for k in keys]
        to_model_key = self._checkpoint_key_mapper(all_keys)
        ignore = [re.compile(p) for p in self._keys_to_ignore_on_load_unexpected]
        tensors, unexpected, mismatched = {}, [], []
        shards = tqdm(files.items(), desc="Loading checkpoint shards", disable=len(files) <= 1, leave=False)
        for file, keys in shards:
            for ckpt_key, tensor in load_safetensors_file(file, keys).items():
                key = to_model_key(ckpt_key)
                if key not in expected:
                    if not any(p.search(key) for p in ignore):
                        unexpected.append(key)
                    continue
                want = tuple(expected[key].shape)
                if tuple(tensor.shape) != want:
                    if not ignore_mismatched_sizes:
                        raise CheckpointError(
                            f"{file}: tensor {ckpt_key!r} has shape {tuple(tensor.shape)} but {type(self).__name__} "
                            f"expects {want} for {key!r} (does config.json match the weights?). Pass "
                            "ignore_mismatched_sizes=True to re-initialise such weights instead."
                        )
                    mismatched.append((key, tuple(tensor.shape), want))
                    continue
                tensors[key] = tensor
        tied = self._tied_keys()
        skipped = {m[0] for m in mismatched}
        missing = [k for k in expected if k not in tensors and k not in tied and k not in skipped]
        return {
            "tensors": tensors,
            "missing_keys": missing,
            "unexpected_keys": unexpected,
            "mismatched_keys": mismatched,
        }

    def _log_loading_info(self, path: str, info: dict) -> None:
        name = type(self).__name__
        if info["unexpected_keys"]:
            logger.warning(
                "Some weights of the model checkpoint at %s were not used when initializing %s: %s",
                path, name, info["unexpected_keys"],
            )
        if info["missing_keys"]:
            logger.warning(
                "Some weights of %s were not initialized from the model checkpoint at %s and are newly "
                "initialized: %s\nYou should probably TRAIN this model on a down-stream task.",
                name, path, info["missing_keys"],
            )
        if info["mismatched_keys"]:
            detail = ", ".join(f"{k}: checkpoint {a} vs model {b}" for k, a, b in info["mismatched_keys"])
            logger.warning("Some weights of %s were re-initialized because of shape mismatches: %s", name, detail)
