"""``hf_lite.pipelines.text_classification`` (transformers' ``pipelines/text_classification.py``): in
``_compat/pipelines/text_classification.py``."""

from .._compat.pipelines.text_classification import ClassificationFunction, TextClassificationPipeline

__all__ = ["ClassificationFunction", "TextClassificationPipeline"]
