"""``hf_lite.pipelines.feature_extraction`` (transformers' ``pipelines/feature_extraction.py``): in
``_compat/pipelines/feature_extraction.py``."""

from .._compat.pipelines.feature_extraction import FeatureExtractionPipeline

__all__ = ["FeatureExtractionPipeline"]
