"""``hf_lite.pipelines`` (transformers' ``pipelines``): ``pipeline(task, ...)`` for text generation, text
classification and feature extraction, and the pipeline classes, from ``_compat/pipelines/``."""

from .._compat.pipelines.base import Pipeline, PipelineException, PipelineRegistry
from .._compat.pipelines.factory import (
    PIPELINE_REGISTRY,
    SUPPORTED_TASKS,
    TASK_ALIASES,
    check_task,
    get_supported_tasks,
    pipeline,
)
from .._compat.pipelines.feature_extraction import FeatureExtractionPipeline
from .._compat.pipelines.text_classification import TextClassificationPipeline
from .._compat.pipelines.text_generation import TextGenerationPipeline

__all__ = [
    "PIPELINE_REGISTRY", "SUPPORTED_TASKS", "TASK_ALIASES", "FeatureExtractionPipeline", "Pipeline",
    "PipelineException", "PipelineRegistry", "TextClassificationPipeline", "TextGenerationPipeline", "check_task",
    "get_supported_tasks", "pipeline",
]
