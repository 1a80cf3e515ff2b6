"""``hf_lite.pipelines.text_generation`` (transformers' ``pipelines/text_generation.py``)."""

from .._compat.pipelines.text_generation import ReturnType, TextGenerationPipeline

__all__ = ["ReturnType", "TextGenerationPipeline"]
