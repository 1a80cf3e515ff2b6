"""``hf_lite.tokenization_gpt2`` (transformers' ``models/gpt2/tokenization_gpt2.py``): ``GPT2Tokenizer`` is the
tokenizer interface (``_compat/tokenization_gpt2.py``) over the core byte-level BPE (``byte_level_bpe.py``)."""

from ._compat.tokenization_gpt2 import VOCAB_FILES_NAMES, GPT2Tokenizer
from .byte_level_bpe import bytes_to_unicode

__all__ = ["VOCAB_FILES_NAMES", "GPT2Tokenizer", "bytes_to_unicode"]
