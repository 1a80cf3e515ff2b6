"""``hf_lite.models.auto.tokenization_auto`` (transformers' ``models/auto/tokenization_auto.py``): ``AutoTokenizer``,
in ``_compat/tokenization_auto.py``."""

from ..._compat.tokenization_auto import TOKENIZER_MAPPING, AutoTokenizer

__all__ = ["TOKENIZER_MAPPING", "AutoTokenizer"]
