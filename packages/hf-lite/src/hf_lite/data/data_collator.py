"""``hf_lite.data.data_collator`` (transformers' ``data/data_collator.py``): in ``_compat/data_collator.py``."""

from .._compat.data_collator import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
)

__all__ = ["DataCollatorForLanguageModeling", "DataCollatorWithPadding", "DefaultDataCollator", "default_data_collator"]
