"""``hf_lite.pipelines.pt_utils`` (transformers' ``pipelines/pt_utils.py``): ``KeyDataset``, ``KeyPairDataset``."""

from .._compat.pipelines.pt_utils import KeyDataset, KeyPairDataset

__all__ = ["KeyDataset", "KeyPairDataset"]
