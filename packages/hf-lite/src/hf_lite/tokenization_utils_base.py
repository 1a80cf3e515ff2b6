"""``hf_lite.tokenization_utils_base`` (transformers' ``tokenization_utils_base.py``): the tokenizer interface, in
``_compat/tokenization_utils_base.py`` over the core byte-level BPE (``byte_level_bpe.py``)."""

from ._compat.batch_encoding import BatchEncoding
from ._compat.tokenization_padding import VERY_LARGE_INTEGER
from ._compat.tokenization_utils_base import (
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    PreTrainedTokenizerBase,
)

__all__ = [
    "SPECIAL_TOKENS_MAP_FILE",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "VERY_LARGE_INTEGER",
    "BatchEncoding",
    "PreTrainedTokenizerBase",
]
