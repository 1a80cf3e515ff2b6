"""Distributed checkpoints (torch.distributed.checkpoint): ``save`` / ``load`` of state dicts whose tensors may be
DTensors, each rank writing its own blocks and reading the blocks it needs, so a checkpoint saved at one world
size and sharding loads at another; ``pt_dist.checkpoint.state_dict`` makes such state dicts from plain, DDP,
FSDP and fully_shard models and their optimizers. The files are torch's format (see ``storage.py``).

The mechanism: ``_checkpointer.py`` (the save's and the load's steps), ``default_planner.py`` with
``planner_helpers.py`` (what each rank writes and reads), ``storage.py`` (the files, committed atomically);
``save`` / ``load`` with torch's arguments and the state-dict plumbing are in ``pt_dist/_compat/checkpoint/``."""

import pt_dist._compat.checkpoint.torch_format  # noqa: F401  (.metadata in torch's format)
from pt_dist._compat.checkpoint.hf_storage import HuggingFaceStorageReader
from pt_dist._compat.checkpoint.optimizer import load_sharded_optimizer_state_dict
from pt_dist._compat.checkpoint.state_dict_loader import load, load_state_dict
from pt_dist._compat.checkpoint.state_dict_saver import async_save, save, save_state_dict

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
    "HuggingFaceStorageReader",
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
    "async_save",
    "load",
    "load_sharded_optimizer_state_dict",
    "load_state_dict",
    "save",
    "save_state_dict",
]
