"""Upstream's ``megatron.core.datasets.indexed_dataset``, kept so Megatron's scripts run;
the code is ``mega_par._compat.datasets.indexed_dataset``."""

from mega_par._compat.datasets.indexed_dataset import (
    DType,
    IndexedDataset,
    IndexedDatasetBuilder,
    get_bin_path,
    get_idx_path,
)

__all__ = ["DType", "IndexedDataset", "IndexedDatasetBuilder", "get_bin_path", "get_idx_path"]
