"""Distributed checkpoints that reshard on load (``megatron/core/dist_checkpointing``)."""

from mega_par.dist_checkpointing.core import CheckpointingException
from mega_par.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory, is_main_replica
from mega_par.dist_checkpointing.serialization import load, load_metadata, save

__all__ = ["CheckpointingException", "ShardedTensor", "ShardedTensorFactory", "is_main_replica", "load",
           "load_metadata", "save"]
