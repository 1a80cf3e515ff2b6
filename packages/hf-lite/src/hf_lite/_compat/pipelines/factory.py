"""``pipeline(task, model=..., tokenizer=...)``: the task's pipeline class over a loaded model and tokenizer
(transformers' ``pipelines/__init__.py``). hf-lite has ``"text-generation"``, ``"text-classification"`` (alias
``"sentiment-analysis"``) and ``"feature-extraction"``; any other name raises transformers' ``KeyError`` naming it
and the supported tasks."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ...configuration_utils import PretrainedConfig
from ...models.auto.configuration_auto import AutoConfig
from ...models.auto.modeling_auto import AutoModel, AutoModelForCausalLM
from ..models.auto import AutoModelForSequenceClassification
from ..tokenization_auto import AutoTokenizer
from .base import Pipeline, PipelineRegistry
from .feature_extraction import FeatureExtractionPipeline
from .text_classification import TextClassificationPipeline
from .text_generation import TextGenerationPipeline

logger = logging.getLogger(__name__)

TASK_ALIASES: dict[str, str] = {"sentiment-analysis": "text-classification"}
SUPPORTED_TASKS: dict[str, Any] = {
    "feature-extraction": {"impl": FeatureExtractionPipeline, "pt": (AutoModel,), "type": "text"},
    "text-classification": {"impl": TextClassificationPipeline, "pt": (AutoModelForSequenceClassification,),
                            "type": "text"},
    "text-generation": {"impl": TextGenerationPipeline, "pt": (AutoModelForCausalLM,), "type": "text"},
}
PIPELINE_REGISTRY = PipelineRegistry(supported_tasks=SUPPORTED_TASKS, task_aliases=TASK_ALIASES)
REMOVED_TASKS = {
    "text2text-generation": "Use the `text-generation` pipeline with a chat model instead.",
    "summarization": "Use the `text-generation` pipeline with a chat model instead.",
    "translation": "Use the `text-generation` pipeline with a chat model instead.",
    "question-answering": "Use the `text-generation` pipeline with a chat model instead.",
}


def get_supported_tasks() -> list[str]:
    return PIPELINE_REGISTRY.get_supported_tasks()


def check_task(task: str) -> tuple[str, dict, Any]:
    """The task's registry entry; a removed or unknown task raises ``KeyError`` naming it (transformers)."""
    removed = "translation" if task.startswith("translation_") else task
    if removed in REMOVED_TASKS:
        raise KeyError(f"The task {task} has been removed from transformers. {REMOVED_TASKS[removed]} See the "
                       "migration guide for more details: https://github.com/huggingface/transformers/blob/main/"
                       "MIGRATION_GUIDE_V5.md#pipelines")
    return PIPELINE_REGISTRY.check_task(task)


def pipeline(task: str | None = None, model=None, config: str | PretrainedConfig | None = None, tokenizer=None,
             feature_extractor=None, image_processor=None, video_processor=None, processor=None,
             revision: str | None = None, use_fast: bool = True, token: str | bool | None = None,
             device: int | str | torch.device | None = None, device_map: str | dict | None = None,
             dtype: str | torch.dtype | None = "auto", trust_remote_code: bool | None = None,
             model_kwargs: dict[str, Any] | None = None, pipeline_class: Any | None = None, **kwargs: Any) -> Pipeline:
    """Build the pipeline for ``task``: ``model`` and ``tokenizer`` are paths (hub names resolve as
    ``from_pretrained`` resolves them) or loaded objects; the remaining kwargs go to the pipeline class."""
    model_kwargs = dict(model_kwargs or {})
    hub_kwargs = {"revision": revision, "token": token, "trust_remote_code": trust_remote_code,
                  "local_files_only": kwargs.get("local_files_only", False)}
    if task is None and model is None:
        raise RuntimeError("Impossible to instantiate a pipeline without either a task or a model being specified. "
                           "Please provide a task class or a model")
    if model is None and tokenizer is not None:
        raise RuntimeError("Impossible to instantiate a pipeline with tokenizer specified but not the model as the "
                           "provided tokenizer may not be compatible with the default model. Please provide a "
                           "PreTrainedModel class or a path/identifier to a pretrained model when providing tokenizer.")
    if task is None:
        raise RuntimeError("Inferring the task automatically requires the hub's `pipeline_tag` for the model; "
                           f"pass the task explicitly (supported: {get_supported_tasks()})")
    if model is None:
        raise RuntimeError(f"pipeline({task!r}) needs `model=`: hf-lite has no default hub model per task")
    for name, value in (("feature_extractor", feature_extractor), ("image_processor", image_processor),
                        ("video_processor", video_processor), ("processor", processor)):
        if value is not None:
            raise ValueError(f"{name}: hf-lite's text pipelines take a tokenizer only")
    normalized_task, targeted_task, _ = check_task(task)
    pipeline_class = pipeline_class or targeted_task["impl"]
    if isinstance(model, Path):
        model = str(model)
    if isinstance(config, str):
        config = AutoConfig.from_pretrained(config, **hub_kwargs, **model_kwargs)
    if device_map is not None:
        if "device_map" in model_kwargs:
            raise ValueError('You cannot use both `pipeline(... device_map=..., model_kwargs={"device_map":...})` as '
                             "those arguments might conflict, use only one.)")
        model_kwargs["device_map"] = device_map
    if kwargs.get("torch_dtype") is not None:
        dtype = kwargs["torch_dtype"] if dtype == "auto" else dtype
    if "torch_dtype" in model_kwargs or "dtype" in model_kwargs:
        if dtype != "auto":
            raise ValueError('You cannot use both `pipeline(... dtype=..., model_kwargs={"dtype":...})` as those '
                             "arguments might conflict, use only one.)")
        dtype = None
    if dtype is not None:
        model_kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and hasattr(torch, dtype) else dtype
    model_name = model if isinstance(model, str) else None
    if model_name is not None:
        loader = targeted_task["pt"][0]
        model = loader.from_pretrained(model_name, **({"config": config} if config is not None else {}),
                                       **hub_kwargs, **model_kwargs)
    if tokenizer is None:
        tokenizer = model_name if model_name is not None else (config if isinstance(config, str) else None)
        if tokenizer is None:
            raise Exception("Impossible to guess which tokenizer to use. Please provide a PreTrainedTokenizer class "
                            "or a path/identifier to a pretrained tokenizer.")
    if isinstance(tokenizer, (str, tuple)):
        identifier, tok_kwargs = (tokenizer[0], dict(tokenizer[1])) if isinstance(tokenizer, tuple) else (
            tokenizer, {k: v for k, v in model_kwargs.items() if k not in ("dtype", "torch_dtype", "device_map")})
        tokenizer = AutoTokenizer.from_pretrained(identifier, use_fast=tok_kwargs.pop("use_fast", use_fast),
                                                  **hub_kwargs, **tok_kwargs)
    kwargs.pop("torch_dtype", None)
    kwargs.pop("local_files_only", None)
    if device is not None:
        kwargs["device"] = device
    return pipeline_class(model=model, tokenizer=tokenizer, task=normalized_task, **kwargs)
