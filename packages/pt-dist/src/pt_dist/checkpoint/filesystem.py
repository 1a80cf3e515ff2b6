"""``torch.distributed.checkpoint.filesystem``: the file-system storage (``pt_dist/checkpoint/storage.py``, beside
the storage protocol it implements) with torch's ``FileSystemWriter`` options
(``pt_dist/_compat/checkpoint/filesystem.py``)."""

from pt_dist._compat.checkpoint.filesystem import FileSystemWriter, SerializationFormat
from pt_dist.checkpoint.storage import (
    _FILES_KEY,
    CURRENT_DCP_VERSION,
    DEFAULT_SUFFIX,
    METADATA_FORMAT,
    FileSystemReader,
    _metadata_fn,
    _StorageInfo,
    _StoragePrefix,
)

__all__ = ["FileSystemReader", "FileSystemWriter", "SerializationFormat"]
_ = (_FILES_KEY, CURRENT_DCP_VERSION, DEFAULT_SUFFIX, METADATA_FORMAT, _metadata_fn, _StorageInfo, _StoragePrefix)
