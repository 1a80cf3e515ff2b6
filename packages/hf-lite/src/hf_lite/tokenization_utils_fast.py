"""``hf_lite.tokenization_utils_fast`` (transformers' ``tokenization_utils_fast.py``): ``PreTrainedTokenizerFast``
over the Rust ``tokenizers`` library, in ``_compat/tokenization_utils_fast.py``."""

from ._compat.tokenization_utils_base import TOKENIZER_FILE, PreTrainedTokenizerBase
from ._compat.tokenization_utils_fast import PreTrainedTokenizerFast, byte_level_bpe_tokenizer

__all__ = ["TOKENIZER_FILE", "PreTrainedTokenizerBase", "PreTrainedTokenizerFast", "byte_level_bpe_tokenizer"]
