"""Upstream's ``megatron.core.datasets.blended_megatron_dataset_config``, kept so Megatron's scripts run;
the code is ``mega_par._compat.datasets.blended_megatron_dataset_config``."""

from mega_par._compat.datasets.blended_megatron_dataset_config import (
    BlendedMegatronDatasetConfig,
    Split,
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)

__all__ = ["BlendedMegatronDatasetConfig", "Split", "convert_split_vector_to_split_matrix", "parse_and_normalize_split"]
