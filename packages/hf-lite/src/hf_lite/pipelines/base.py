"""``hf_lite.pipelines.base`` (transformers' ``pipelines/base.py``): the ``Pipeline`` base class and batching."""

from .._compat.pipelines.base import (
    Chat,
    Pipeline,
    PipelineException,
    PipelineRegistry,
    no_collate_fn,
    pad_collate_fn,
)

__all__ = ["Chat", "Pipeline", "PipelineException", "PipelineRegistry", "no_collate_fn", "pad_collate_fn"]
