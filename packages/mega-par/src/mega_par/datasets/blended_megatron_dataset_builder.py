"""Upstream's ``megatron.core.datasets.blended_megatron_dataset_builder``, kept so Megatron's scripts run;
the code is ``mega_par._compat.datasets.blended_megatron_dataset_builder``."""

from mega_par._compat.datasets.blended_megatron_dataset_builder import (
    BlendedDataset,
    BlendedMegatronDatasetBuilder,
    build_blending_indices,
)

__all__ = ["BlendedDataset", "BlendedMegatronDatasetBuilder", "build_blending_indices"]
