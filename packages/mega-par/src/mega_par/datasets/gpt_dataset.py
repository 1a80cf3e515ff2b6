"""Upstream's ``megatron.core.datasets.gpt_dataset``, kept so Megatron's scripts run;
the code is ``mega_par._compat.datasets.gpt_dataset``."""

from mega_par._compat.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset, MockGPTLowLevelDataset

__all__ = ["GPTDataset", "GPTDatasetConfig", "MockGPTDataset", "MockGPTLowLevelDataset"]
