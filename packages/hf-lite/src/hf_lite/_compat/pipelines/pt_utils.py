"""Datasets that feed one column of another dataset to a pipeline (transformers' ``pipelines/pt_utils.py``)."""

from __future__ import annotations

from torch.utils.data import Dataset


class KeyDataset(Dataset):
    """``dataset[i][key]``: one column of a dataset of dicts, e.g. ``pipe(KeyDataset(ds, "text"), batch_size=8)``."""

    def __init__(self, dataset: Dataset, key: str):
        self.dataset, self.key = dataset, key

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i][self.key]


class KeyPairDataset(Dataset):
    """``{"text": dataset[i][key1], "text_pair": dataset[i][key2]}`` for pair-input pipelines."""

    def __init__(self, dataset: Dataset, key1: str, key2: str):
        self.dataset, self.key1, self.key2 = dataset, key1, key2

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return {"text": self.dataset[i][self.key1], "text_pair": self.dataset[i][self.key2]}
