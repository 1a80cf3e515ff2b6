from .data_collator import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    default_data_collator,
)
from .language_modeling import GroupedTextsDataset, IterableGroupedTextsDataset, group_texts

__all__ = [
    "DataCollatorForLanguageModeling",
    "DataCollatorWithPadding",
    "GroupedTextsDataset",
    "IterableGroupedTextsDataset",
    "default_data_collator",
    "group_texts",
]
