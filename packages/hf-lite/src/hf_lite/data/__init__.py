"""``hf_lite.data`` (transformers' ``data`` package): collators (``_compat/data_collator.py``) and run_clm.py's
``group_texts`` as datasets (``_compat/language_modeling.py``)."""

from .._compat.language_modeling import GroupedTextsDataset, IterableGroupedTextsDataset, group_texts
from .data_collator import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
)

__all__ = [
    "DataCollatorForLanguageModeling",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "GroupedTextsDataset",
    "IterableGroupedTextsDataset",
    "default_data_collator",
    "group_texts",
]
