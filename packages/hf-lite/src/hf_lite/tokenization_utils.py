"""``hf_lite.tokenization_utils`` (transformers' slow ``tokenization_utils.py``): ``PreTrainedTokenizer``, in
``_compat/tokenization_utils.py``."""

from ._compat.tokenization_utils import PreTrainedTokenizer

__all__ = ["PreTrainedTokenizer"]
