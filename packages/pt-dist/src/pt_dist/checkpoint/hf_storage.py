"""``torch.distributed.checkpoint.hf_storage``: ``HuggingFaceStorageReader``
(``pt_dist/_compat/checkpoint/hf_storage.py``)."""

from pt_dist._compat.checkpoint.hf_storage import HuggingFaceStorageReader

__all__ = ["HuggingFaceStorageReader"]  # torch's, less HuggingFaceStorageWriter
