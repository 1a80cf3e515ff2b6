"""Distributed checkpoints (torch.distributed.checkpoint): ``save`` / ``load`` of state dicts whose tensors may be
DTensors, each rank writing its own blocks and reading the blocks it needs, so a checkpoint saved at one world
size and sharding loads at another; ``pt_dist.checkpoint.state_dict`` makes such state dicts from plain, DDP,
FSDP and fully_shard models and their optimizers. The files are torch's format (see ``filesystem.py``)."""

from .api import CheckpointException
from .default_planner import DefaultLoadPlanner, DefaultSavePlanner
from .filesystem import FileSystemReader, FileSystemWriter
from .metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from .planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem
from .state_dict_loader import load
from .state_dict_saver import save
from .stateful import Stateful
from .storage import StorageReader, StorageWriter

__all__ = [
    "BytesStorageMetadata",
    "CheckpointException",
    "ChunkStorageMetadata",
    "DefaultLoadPlanner",
    "DefaultSavePlanner",
    "FileSystemReader",
    "FileSystemWriter",
    "LoadPlan",
    "LoadPlanner",
    "Metadata",
    "MetadataIndex",
    "ReadItem",
    "SavePlan",
    "SavePlanner",
    "StorageReader",
    "StorageWriter",
    "Stateful",
    "TensorProperties",
    "TensorStorageMetadata",
    "WriteItem",
    "load",
    "save",
]
