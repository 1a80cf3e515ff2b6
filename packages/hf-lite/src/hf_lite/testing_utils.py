"""``hf_lite.testing_utils`` (transformers' ``testing_utils.py``): ``CaptureLogger``, in
``_compat/testing_utils.py``."""

from ._compat.testing_utils import CaptureLogger

__all__ = ["CaptureLogger"]
