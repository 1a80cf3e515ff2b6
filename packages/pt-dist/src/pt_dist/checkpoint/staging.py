"""``torch.distributed.checkpoint.staging``: ``async_save``'s stagers (``pt_dist/_compat/checkpoint/staging.py``)."""

from pt_dist._compat.checkpoint.staging import AsyncStager, BlockingAsyncStager, DefaultStager, StagingOptions

__all__ = ["AsyncStager", "BlockingAsyncStager", "DefaultStager", "StagingOptions"]
