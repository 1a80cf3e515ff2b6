"""PreTrainedModel: weight init, tied weights, training switches and the checkpoint-directory contract
(transformers' ``modeling_utils``).

``from_pretrained`` builds the model uninitialised in the target dtype, then ``core_model_loading`` fills it from
``config.json`` + safetensors (single file or shards with an index). ``save_pretrained`` writes the layout
transformers reads, staged beside the directory and swapped in whole.
"""

from __future__ import annotations

import copy
import functools
import os

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ._infra.atomic_io import atomic_save_directory
from ._infra.hub import ModelPushToHubMixin, cached_checkpoint, pop_hub_kwargs
from .checkpoint_bin import is_bin_weight_file, save_bin_state_dict
from .checkpoint_utils import is_weight_file, save_state_dict
from .configuration_utils import CONFIG_NAME, PretrainedConfig, to_torch_dtype
from .core_model_loading import (
    checkpoint_float_dtype,
    load_checkpoint,
    log_loading_info,
    resolve_checkpoint_files,
    weight_file_names,
)
from .generation.configuration_utils import GENERATION_CONFIG_NAME, GenerationConfig
from .initialization import default_dtype, init_weights_enabled, no_init_weights
from .loss_utils import LOSS_MAPPING
from .modeling_layers import GradientCheckpointingLayer


def _resolve_dtype(dtype, torch_dtype=None):
    """``dtype`` / ``torch_dtype`` (transformers 4's name) -> a floating torch dtype, ``"auto"`` or None."""
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; pass only dtype")
    dtype = torch_dtype if dtype is None else dtype
    if dtype is None or dtype == "auto":
        return dtype
    resolved = to_torch_dtype(dtype)
    if not resolved.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: a model is built in a floating-point dtype (e.g. 'bfloat16')")
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


class PreTrainedModel(nn.Module, ModelPushToHubMixin):
    """Base of every model. Subclasses set ``config_class``, ``base_model_prefix`` and ``_init_weights``."""

    config_class: type[PretrainedConfig] = PretrainedConfig
    base_model_prefix: str = ""
    main_input_name = "input_ids"
    # {target: source} as transformers 5 spells it: the target parameter is the source parameter when tied.
    _tied_weights_keys: dict[str, str] = {}
    _keys_to_ignore_on_load_unexpected: list[str] = []
    # Modules that must stay on one device when a model is split (accelerate's device maps read it).
    _no_split_modules: list[str] = []
    supports_gradient_checkpointing = False
    loss_type: str | None = None

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
        if init_weights_enabled():  # skipped while from_pretrained builds a model it is about to fill
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
        """State-dict keys naming a tensor another key already names: the declared ``_tied_weights_keys`` targets
        and any tie a model makes in its own ``tie_weights``. They are saved once and re-tied on load."""
        declared = set(self._tied_weights_keys) if getattr(self.config, "tie_word_embeddings", False) else set()
        by_tensor: dict[int, list[str]] = {}
        for key, tensor in self.state_dict(keep_vars=True).items():
            by_tensor.setdefault(id(tensor), []).append(key)
        tied = set()
        for names in by_tensor.values():
            if len(names) > 1:
                keep = next((n for n in names if n not in declared), names[0])
                tied.update(n for n in names if n != keep)
        return tied

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
        return sum(p.numel() for p in self.parameters() if id(p) not in skip
                   and (p.requires_grad or not only_trainable))

    def _output_flags(self, output_attentions, output_hidden_states) -> tuple[bool, bool]:
        """``None`` reads the config, as in transformers."""
        config = self.config
        return (
            getattr(config, "output_attentions", False) if output_attentions is None else output_attentions,
            getattr(config, "output_hidden_states", False) if output_hidden_states is None else output_hidden_states,
        )

    def estimate_tokens(self, input_dict: dict) -> int:
        return input_dict[self.main_input_name].numel() if self.main_input_name in input_dict else 0

    def floating_point_ops(self, input_dict: dict, exclude_embeddings: bool = True) -> int:
        """6 x tokens x parameters per forward + backward (Kaplan et al. 2020, sec. 2.1), what the Trainer logs."""
        return 6 * self.estimate_tokens(input_dict) * self.num_parameters(exclude_embeddings=exclude_embeddings)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Grow/shrink the vocabulary; new rows are drawn around the old rows' mean (transformers' mean_resizing)."""
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
            if mean_resizing and new_w.shape[0] > n:
                # new rows drawn from N(mean, 1e-9 * covariance) of the old rows (Hewitt 2021), as transformers does
                old, added = old_w.float(), new_w.shape[0] - n
                mean = old.mean(0)
                cov = 1e-9 * ((old - mean).T @ (old - mean) / old.shape[0])
                if bool(torch.distributions.constraints.positive_definite.check(cov).all()):
                    mean = torch.distributions.MultivariateNormal(mean, covariance_matrix=cov).sample((added,))
                new_w[n:] = mean.to(new_w.dtype).expand(added, -1)
            elif not mean_resizing:
                std = getattr(self.config, "initializer_range", 0.02)
                new_w.normal_(0.0, std)
            new_w[:n] = old_w[:n]

    # ------------------------------------------------------------------ training
    @property
    def loss_function(self):
        if hasattr(self, "_loss_function"):
            return self._loss_function
        loss_type = self.loss_type or getattr(self.config, "loss_type", None) or "ForCausalLM"
        if loss_type not in LOSS_MAPPING:
            raise ValueError(f"loss_type={loss_type!r} is not one of {sorted(LOSS_MAPPING)}")
        return LOSS_MAPPING[loss_type]

    @loss_function.setter
    def loss_function(self, value) -> None:
        self._loss_function = value

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each decoder block in backward instead of keeping its activations (non-reentrant by default,
        as transformers 5). The input embeddings' output requires grad, so reentrant checkpointing of frozen
        embeddings still reaches the trainable layers."""
        if not self.supports_gradient_checkpointing:
            raise ValueError(f"{type(self).__name__} does not support gradient checkpointing.")
        kwargs = {"use_reentrant": False} if gradient_checkpointing_kwargs is None else gradient_checkpointing_kwargs
        func = functools.partial(checkpoint, **kwargs)
        for module in self.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.gradient_checkpointing, module._gradient_checkpointing_func = True, func
        if self.main_input_name == "input_ids":
            self.enable_input_require_grads()

    def gradient_checkpointing_disable(self) -> None:
        for module in self.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.gradient_checkpointing = False

    # transformers 5.24 renamed them; its Trainer calls the new names.
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None) -> None:
        self.gradient_checkpointing_enable(activation_checkpointing_kwargs)

    def activation_checkpointing_disable(self) -> None:
        self.gradient_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    def enable_input_require_grads(self) -> None:
        def make_inputs_require_grads(module, inputs, output):
            output.requires_grad_(True)

        self.disable_input_require_grads()
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def disable_input_require_grads(self) -> None:
        hook = self.__dict__.pop("_require_grads_hook", None)
        if hook is not None:
            hook.remove()

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True,
                        state_dict: dict[str, torch.Tensor] | None = None, save_function=torch.save,
                        push_to_hub: bool = False, max_shard_size: int | str = "50GB", safe_serialization: bool = True,
                        variant: str | None = None, token: str | bool | None = None, save_peft_format: bool = True,
                        save_original_format: bool = True, distributed_checkpoint: bool = False, **kwargs) -> None:
        """Write config.json, generation_config.json and the weights; the directory changes in one step.

        transformers 5.24's signature, with transformers 4's ``save_function`` and ``safe_serialization`` (5.24
        takes both in ``kwargs`` and ignores them): safetensors by default, ``save_function`` unused there as in
        both; ``safe_serialization=False`` writes ``pytorch_model.bin`` shards with ``save_function(shard, path)``
        (accelerate's ``Accelerator.save``). Under torchrun every rank calls this; only ``is_main_process`` writes.
        Files other than this save's (a tokenizer, other variants) stay. ``push_to_hub`` commits the files this
        save changed, with a model card (``repo_id``, ``commit_message``, ``private``... in ``kwargs``). There are
        no adapters or converted weights here, so ``save_peft_format`` and ``save_original_format`` change nothing.
        """
        if distributed_checkpoint:
            raise ValueError("distributed_checkpoint=True: hf-lite has no DCP writer; gather the state dict instead")
        if not is_main_process:
            return
        hub = self._create_repo(save_directory, push_to_hub, kwargs, token)  # the repo first (_infra/hub.py)
        # A tied copy is written once, also from a given state_dict (the Trainer passes model.state_dict()):
        # the loader re-ties it, as in transformers.
        state_dict = self.state_dict() if state_dict is None else state_dict
        tied, shared = self._tied_keys(), {}
        for key, tensor in state_dict.items():
            shared.setdefault((tensor.device, tensor.untyped_storage().data_ptr()), []).append(key)
        state_dict = {k: v for k, v in state_dict.items() if k not in tied
                      or len(shared[(v.device, v.untyped_storage().data_ptr())]) == 1}
        self.config.architectures = [type(self).__name__]
        self.config.dtype = self.dtype

        weight_file = is_weight_file if safe_serialization else is_bin_weight_file

        def owned(name: str) -> bool:
            return name in (CONFIG_NAME, GENERATION_CONFIG_NAME) or weight_file(name, variant)

        with atomic_save_directory(save_directory, owned) as stage:
            self.config.save_pretrained(stage)
            if self.generation_config is not None:
                self.generation_config.save_pretrained(stage)
            if safe_serialization:
                save_state_dict(state_dict, stage, max_shard_size=max_shard_size, variant=variant,
                                index_metadata={"total_parameters": self.num_parameters()})
            else:
                save_bin_state_dict(state_dict, stage, max_shard_size, variant, save_function)
        if push_to_hub:
            self._upload_saved(save_directory, token=token, **hub)

    # ------------------------------------------------------------------ loading
    @classmethod
    def _from_config(cls, config: PretrainedConfig, dtype=None, torch_dtype=None, **kwargs):
        """A freshly initialised model in ``dtype`` (transformers' ``from_config`` path)."""
        pop_hub_kwargs(kwargs)
        dtype = _resolve_dtype(dtype, torch_dtype)
        if dtype == "auto":
            dtype = config.dtype
        config = copy.deepcopy(config)
        with default_dtype(dtype):
            model = cls(config, **kwargs)
        if dtype is not None:
            config.dtype = dtype
        return model

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args,
                        config: PretrainedConfig | None = None, dtype=None, torch_dtype=None, device_map=None,
                        output_loading_info: bool = False, ignore_mismatched_sizes: bool = False, subfolder: str = "",
                        variant: str | None = None, use_safetensors: bool | None = None, **kwargs):
        """A local directory or a hub name (its files fetched into the cache by ``_infra/hub.py``: ``cache_dir``,
        ``revision``, ``token``, ``local_files_only``, ``force_download``). Kwargs naming config attributes override
        config.json; any other goes to the model's ``__init__``."""
        download, trust_remote_code = pop_hub_kwargs(kwargs)
        path = cached_checkpoint(pretrained_model_name_or_path, weight_file_names(variant, use_safetensors),
                                 subfolder=subfolder, **download)
        if config is None:
            config, model_kwargs = cls.config_class.from_pretrained(path, return_unused_kwargs=True,
                                                                    trust_remote_code=trust_remote_code, **kwargs)
        else:
            config, model_kwargs = copy.deepcopy(config), kwargs
        requested = _resolve_dtype(dtype, torch_dtype) or "auto"
        files = resolve_checkpoint_files(path, variant, use_safetensors)
        if requested == "auto":
            requested = config.dtype or checkpoint_float_dtype(files) or torch.get_default_dtype()
        device = _resolve_device(device_map) or torch.device("cpu")
        with no_init_weights(), default_dtype(requested), device:
            model = cls(config, *model_args, **model_kwargs)
        model.tie_weights()  # before loading: a tied key is filled through the weight it shares, never missing
        info = load_checkpoint(model, files, ignore_mismatched_sizes)
        model.tie_weights()
        model.config.dtype = requested
        model.eval()
        gen_file = os.path.join(path, GENERATION_CONFIG_NAME)
        if model.can_generate() and os.path.isfile(gen_file):
            model.generation_config = GenerationConfig.from_pretrained(path)
        log_loading_info(model, path, info)
        return (model, info) if output_loading_info else model
