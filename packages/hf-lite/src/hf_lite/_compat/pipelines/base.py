"""``Pipeline``: preprocess -> forward -> postprocess over a model and its tokenizer (transformers'
``pipelines/base.py``).

A single input runs the three steps once. A list (or a generator, or a torch ``Dataset``) goes through a torch
``DataLoader`` whose collate function pads each batch of ``batch_size`` preprocessed inputs on the tokenizer's
padding side; the batched forward output is split back into one item per input before ``postprocess``, as
transformers' ``PipelineIterator`` does. Using the ``DataLoader`` is also what keeps seeded sampling identical: its
iterator draws one seed from torch's global generator, as transformers' does.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import types
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..._infra.hub import PushToHubMixin
from ...generation import GenerationConfig
from .pt_utils import KeyDataset

logger = logging.getLogger(__name__)


class PipelineException(Exception):
    """Raised by a pipeline's ``__call__`` when it cannot handle the inputs (transformers' name)."""

    def __init__(self, task: str, model: str, reason: str):
        super().__init__(reason)
        self.task = task
        self.model = model


def is_valid_message(message) -> bool:
    """A chat message is a dict with ``role`` and ``content`` (transformers' ``chat_template_utils``)."""
    return isinstance(message, dict) and "role" in message and "content" in message


class Chat:
    """One conversation, so that a list of messages is not taken for a batch of inputs (transformers' ``Chat``)."""

    def __init__(self, messages):
        for message in messages:
            if not is_valid_message(message):
                raise ValueError("When passing chat dicts as input, each dict must have a 'role' and 'content' key.")
        self.messages = messages


def _as_chats(inputs):
    """A message list becomes one ``Chat``, a list of message lists a list of them; other inputs pass through."""
    if isinstance(inputs, types.GeneratorType):
        first = next(inputs, None)
        if first is None:
            return []
        if is_valid_message(first):
            return Chat([first, *inputs])
        if isinstance(first, (list, tuple)) and first and is_valid_message(first[0]):
            return (Chat(c) for gen in ([first], inputs) for c in gen)
        return (x for gen in ([first], inputs) for x in gen)
    if isinstance(inputs, (list, tuple, KeyDataset)) and len(inputs) > 0:
        if is_valid_message(inputs[0]):
            return Chat(inputs)
        if isinstance(inputs[0], (list, tuple)) and all(c and is_valid_message(c[0]) for c in inputs):
            return [Chat(c) for c in inputs]
    return inputs


def _pad(items: list[dict], key: str, value: int, side: str):
    """Stack one key of a batch; 2-D tensors of different lengths are padded with ``value`` on ``side``."""
    first = items[0][key]
    if not isinstance(first, torch.Tensor):
        return [item[key] for item in items]
    if first.dim() == 1:
        return torch.cat([item[key] for item in items])
    lengths = [item[key].shape[1] for item in items]
    if min(lengths) == max(lengths):
        return torch.cat([item[key] for item in items])
    out = torch.full((len(items), max(lengths), *first.shape[2:]), value, dtype=first.dtype)
    for i, item in enumerate(items):
        row = item[key][0]
        if side == "left":
            out[i, out.shape[1] - len(row):] = row
        else:
            out[i, : len(row)] = row
    return out


def pad_collate_fn(tokenizer, feature_extractor=None):
    """Collate preprocessed inputs into one batch: ids padded with the pad token, masks with 0 (transformers)."""
    if tokenizer is None:
        raise ValueError("Pipeline without tokenizer or feature_extractor cannot do batching")
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "Pipeline with tokenizer without pad_token cannot do batching. You can try to set it with "
            "`pipe.tokenizer.pad_token_id = model.config.eos_token_id`."
        )
    pad_values = {"input_ids": tokenizer.pad_token_id, "p_mask": 1, "special_tokens_mask": 1}

    def inner(items):
        keys = set(items[0])
        for item in items:
            if set(item) != keys:
                raise ValueError(f"The elements of the batch contain different keys. Cannot batch them ({set(item)} "
                                 f"!= {keys})")
        return {key: _pad(items, key, pad_values.get(key, 0), tokenizer.padding_side) for key in keys}

    return inner


def no_collate_fn(items):
    if len(items) != 1:
        raise ValueError("This collate_fn is meant to be used with batch_size=1")
    return items[0]


def _unbatch(batch: dict, i: int) -> dict:
    """Item ``i`` of a batched forward output, shaped as a batch of one (transformers' ``loader_batch_item``)."""
    item = {}
    for key, value in batch.items():
        if value is None:
            item[key] = None
        elif isinstance(value, torch.Tensor):
            item[key] = value[i].unsqueeze(0)
        else:
            item[key] = value[i]
    return item


class _PreprocessedDataset(Dataset):
    def __init__(self, inputs, preprocess, params):
        self.inputs, self.preprocess, self.params = inputs, preprocess, params

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return self.preprocess(self.inputs[i], **self.params)


class _PreprocessedIterable(torch.utils.data.IterableDataset):
    def __init__(self, inputs, preprocess, params):
        self.inputs, self.preprocess, self.params = inputs, preprocess, params

    def __iter__(self):
        for item in self.inputs:
            yield self.preprocess(item, **self.params)


class Pipeline(ABC, PushToHubMixin):
    """Base class of the task pipelines: ``__call__`` runs ``preprocess`` -> ``_forward`` -> ``postprocess`` with
    the parameters ``_sanitize_parameters`` split among them (transformers' ``Pipeline``)."""

    _load_processor = None
    _load_image_processor = None
    _load_feature_extractor = None
    _load_tokenizer = None
    _pipeline_calls_generate = False
    _default_generation_config: GenerationConfig | None = None
    _non_generation_params: tuple[str, ...] = ()
    default_input_names = None

    def __init__(self, model, tokenizer=None, feature_extractor=None, image_processor=None, processor=None,
                 task: str = "", device: int | str | torch.device | None = None, binary_output: bool = False,
                 **kwargs):
        for key in ("args_parser", "torch_dtype", "dtype"):
            kwargs.pop(key, None)
        self.task, self.model, self.tokenizer = task, model, tokenizer
        self.feature_extractor, self.image_processor, self.processor = feature_extractor, image_processor, processor
        self.device = _resolve_device(device, model)
        self.binary_output = binary_output
        if self.model.device != self.device:
            self.model.to(self.device)
        if self._pipeline_calls_generate and self.model.can_generate():
            self.assistant_model = self.assistant_tokenizer = None
            if kwargs.pop("assistant_model", None) is not None:
                raise ValueError("assistant_model: hf-lite's generate has no assisted decoding")
            kwargs.pop("assistant_tokenizer", None)
            self.prefix = getattr(self.model.config, "prefix", None)
            generation_keys = {k for k in vars(GenerationConfig()) if not k.startswith("_")}
            generation_keys.difference_update(self._non_generation_params)
            generation_keys.add("generation_config")
            self._generate_kwargs = {key: kwargs.pop(key) for key in generation_keys & kwargs.keys()}
            defaults = self._default_generation_config
            self._generation_defaults = {} if defaults is None else defaults.to_diff_dict()
            if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
                self._generation_defaults["pad_token_id"] = self.tokenizer.pad_token_id
        self.call_count = 0
        self._batch_size = kwargs.pop("batch_size", None)
        self._num_workers = kwargs.pop("num_workers", None)
        self._preprocess_params, self._forward_params, self._postprocess_params = self._sanitize_parameters(**kwargs)

    def __repr__(self):
        return f"{type(self).__name__}: {{'model': '{type(self.model).__name__}', 'device': '{self.device.type}'}}"

    @property
    def dtype(self) -> torch.dtype | None:
        return getattr(self.model, "dtype", None)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return self.dtype

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """The model and the tokenizer into one directory."""
        if os.path.isfile(save_directory):
            logger.error("Provided path (%s) should be a directory, not a file", save_directory)
            return
        os.makedirs(save_directory, exist_ok=True)
        self.model.save_pretrained(save_directory, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory, **kwargs)

    def transform(self, X):
        """Scikit / Keras interface: ``self(X)``."""
        return self(X)

    def predict(self, X):
        """Scikit / Keras interface: ``self(X)``."""
        return self(X)

    def device_placement(self):
        """Context of the forward pass (transformers sets the CUDA device here)."""
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def ensure_tensor_on_device(self, **inputs):
        return self._ensure_tensor_on_device(inputs, self.device)

    def _ensure_tensor_on_device(self, inputs, device):
        if isinstance(inputs, dict):
            return {name: self._ensure_tensor_on_device(value, device) for name, value in inputs.items()}
        if isinstance(inputs, list):
            return [self._ensure_tensor_on_device(item, device) for item in inputs]
        if isinstance(inputs, tuple):
            return tuple(self._ensure_tensor_on_device(item, device) for item in inputs)
        return inputs.to(device) if isinstance(inputs, torch.Tensor) else inputs

    def check_model_type(self, supported_models: list[str] | dict) -> None:
        """Log an error when the model's class is not one the task supports (transformers does not raise)."""
        if isinstance(supported_models, dict):
            supported_models = [getattr(m, "__name__", m) for m in supported_models.values()]
        if type(self.model).__name__ not in supported_models:
            logger.error("The model '%s' is not supported for %s. Supported models are %s.",
                         type(self.model).__name__, self.task, supported_models)

    # ------------------------------------------------------------------ generation parameters
    def _prepare_generate_kwargs(self, generate_kwargs: dict, **overrides) -> dict:
        """The call's generation kwargs over those given at construction, plus the pipeline's defaults for what
        neither the user nor the model's generation config set (sampling ones only when sampling)."""
        sampling_params = {"temperature", "top_k", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff",
                           "eta_cutoff"}
        if "generation_config" not in generate_kwargs:
            generate_kwargs = {**self._generate_kwargs, **generate_kwargs}
        set_params = self._get_set_generation_params(generate_kwargs)
        added = {key: value for key, value in self._generation_defaults.items()
                 if key not in set_params and not (key == "max_new_tokens" and "max_length" in set_params)}
        if not {**set_params, **added}.get("do_sample"):
            added = {key: value for key, value in added.items() if key not in sampling_params}
        added.update(overrides)
        if (user_config := generate_kwargs.get("generation_config")) is None:
            return {**generate_kwargs, **added}
        user_config = copy.deepcopy(user_config)
        user_config.update(**added)
        return {**generate_kwargs, "generation_config": user_config}

    def _get_set_generation_params(self, generate_kwargs: dict) -> dict:
        """What a ``generate`` call with these kwargs does not take from the defaults: kwargs over their
        ``generation_config`` over the model's."""
        params = self.model.generation_config.to_diff_dict()
        if (generation_config := generate_kwargs.get("generation_config")) is not None:
            params.update(generation_config.to_diff_dict())
        return {**params, **generate_kwargs}

    # ------------------------------------------------------------------ the three steps
    @abstractmethod
    def _sanitize_parameters(self, **pipeline_parameters) -> tuple[dict, dict, dict]:
        """Split keyword arguments into preprocess, forward and postprocess parameters."""

    @abstractmethod
    def preprocess(self, input_: Any, **preprocess_parameters) -> dict:
        """One raw input -> the model's tensors."""

    @abstractmethod
    def _forward(self, input_tensors: dict, **forward_parameters) -> dict:
        """The model call; ``forward`` wraps it with ``no_grad`` and device moves."""

    @abstractmethod
    def postprocess(self, model_outputs: dict, **postprocess_parameters) -> Any:
        """The model's outputs -> the user-facing records."""

    def get_inference_context(self):
        return torch.no_grad

    def forward(self, model_inputs, **forward_params):
        with self.device_placement(), self.get_inference_context()():
            model_inputs = self._ensure_tensor_on_device(model_inputs, self.device)
            model_outputs = self._forward(model_inputs, **forward_params)
            return self._ensure_tensor_on_device(model_outputs, torch.device("cpu"))

    def get_iterator(self, inputs, num_workers: int, batch_size: int, preprocess_params, forward_params,
                     postprocess_params):
        """Preprocess lazily through a ``DataLoader`` of ``batch_size``, forward each batch, postprocess each item."""
        if hasattr(inputs, "__len__") and hasattr(inputs, "__getitem__"):
            dataset = _PreprocessedDataset(inputs, self.preprocess, preprocess_params)
        else:
            if num_workers > 1:
                logger.warning("For iterable dataset using num_workers>1 is likely to result in errors since "
                               "everything is iterable, setting `num_workers=1` to guarantee correctness.")
                num_workers = 1
            dataset = _PreprocessedIterable(inputs, self.preprocess, preprocess_params)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        collate_fn = no_collate_fn if batch_size == 1 else pad_collate_fn(self.tokenizer, self.feature_extractor)
        loader = DataLoader(dataset, num_workers=num_workers, batch_size=batch_size, collate_fn=collate_fn)
        for batch in loader:
            outputs = self.forward(batch, **forward_params)
            if batch_size == 1:
                yield self.postprocess(outputs, **postprocess_params)
                continue
            first = next(iter(outputs.values()))
            for i in range(len(first) if isinstance(first, list) else first.shape[0]):
                yield self.postprocess(_unbatch(outputs, i), **postprocess_params)

    def __call__(self, inputs, *args, num_workers: int | None = None, batch_size: int | None = None, **kwargs):
        if args:
            logger.warning("Ignoring args : %s", args)
        inputs = _as_chats(inputs)
        num_workers = num_workers if num_workers is not None else (self._num_workers or 0)
        batch_size = batch_size if batch_size is not None else (self._batch_size or 1)
        preprocess_params, forward_params, postprocess_params = self._sanitize_parameters(**kwargs)
        preprocess_params = {**self._preprocess_params, **preprocess_params}
        forward_params = {**self._forward_params, **forward_params}
        postprocess_params = {**self._postprocess_params, **postprocess_params}
        self.call_count += 1
        params = (preprocess_params, forward_params, postprocess_params)
        if isinstance(inputs, list):
            return list(self.get_iterator(inputs, num_workers, batch_size, *params))
        if isinstance(inputs, (Dataset, types.GeneratorType)):
            return self.get_iterator(inputs, num_workers, batch_size, *params)
        return self.run_single(inputs, *params)

    def run_single(self, inputs, preprocess_params, forward_params, postprocess_params):
        model_inputs = self.preprocess(inputs, **preprocess_params)
        model_outputs = self.forward(model_inputs, **forward_params)
        return self.postprocess(model_outputs, **postprocess_params)


def _resolve_device(device, model) -> torch.device:
    """transformers' rule: None means device 0 (the first GPU when there is one), -1 the CPU."""
    if device is None:
        device = 0
    if device == -1:
        return model.device
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        return torch.device(device)
    if device < 0:
        return torch.device("cpu")
    return torch.device(f"cuda:{device}") if torch.cuda.is_available() else torch.device("cpu")


class PipelineRegistry:
    """Task name -> pipeline class and model classes; aliases resolve first (transformers' ``PipelineRegistry``)."""

    def __init__(self, supported_tasks: dict[str, Any], task_aliases: dict[str, str]) -> None:
        self.supported_tasks = supported_tasks
        self.task_aliases = task_aliases

    def get_supported_tasks(self) -> list[str]:
        return sorted([*self.supported_tasks, *self.task_aliases])

    def check_task(self, task: str) -> tuple[str, dict, Any]:
        task = self.task_aliases.get(task, task)
        if task in self.supported_tasks:
            return task, self.supported_tasks[task], None
        raise KeyError(f"Unknown task {task}, available tasks are {self.get_supported_tasks()}")

    def register_pipeline(self, task: str, pipeline_class: type, pt_model: type | tuple[type] | None = None,
                          default: dict | None = None, type: str | None = None) -> None:
        if task in self.supported_tasks:
            logger.warning("%s is already registered. Overwriting pipeline for task %s...", task, task)
        pt_model = () if pt_model is None else (pt_model if isinstance(pt_model, tuple) else (pt_model,))
        task_impl = {"impl": pipeline_class, "pt": pt_model}
        if default is not None:
            task_impl["default"] = default if "model" in default else {"model": default}
        if type is not None:
            task_impl["type"] = type
        self.supported_tasks[task] = task_impl
        pipeline_class._registered_impl = {task: task_impl}

    def to_dict(self):
        return self.supported_tasks
