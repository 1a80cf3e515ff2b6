"""Converting between distributed checkpoints and ``torch.save`` files (torch's
``torch/distributed/checkpoint/format_utils.py``): ``dcp_to_torch_save`` loads every value a DCP directory holds
into an empty state dict (``_EmptyStateDictLoadPlanner``: the tensors made from the metadata, the nesting from the
planner's data) in one process and ``torch.save``-s it; ``torch_save_to_dcp`` saves a ``torch.load``-ed state dict
as a DCP checkpoint. ``BroadcastingTorchSaveReader`` with ``DynamicMetaLoadPlanner`` loads a ``torch.save`` file
into a (sharded) state dict: the coordinator reads it and broadcasts each tensor, every rank keeps its part."""

from __future__ import annotations

import os
from typing import cast

import torch
from torch.futures import Future

from pt_dist import distributed_c10d as c10d
from pt_dist.checkpoint._checkpointer import _load_state_dict, _save_state_dict
from pt_dist.checkpoint._nested_dict import flatten_state_dict, set_element
from pt_dist.checkpoint.default_planner import DefaultLoadPlanner
from pt_dist.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE, Metadata, TensorProperties, TensorStorageMetadata
from pt_dist.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from pt_dist.checkpoint.planner_helpers import _create_chunk_list
from pt_dist.checkpoint.storage import StorageReader
from pt_dist.checkpoint.utils import narrow_tensor_by_index

__all__ = ["BroadcastingTorchSaveReader", "DynamicMetaLoadPlanner", "dcp_to_torch_save", "torch_save_to_dcp"]


class _EmptyStateDictLoadPlanner(DefaultLoadPlanner):
    """Load into an empty state dict: every key of the checkpoint, tensors allocated from its metadata, nested
    as the saving planner flattened them (torch's ``_EmptyStateDictLoadPlanner``, without its ``keys`` filter)."""

    def set_up_planner(self, state_dict: STATE_DICT_TYPE, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        if state_dict:
            raise ValueError(f"_EmptyStateDictLoadPlanner needs an empty state dict, got keys {sorted(state_dict)}")
        if metadata is None:
            raise ValueError("_EmptyStateDictLoadPlanner needs the checkpoint's metadata")
        paths = metadata.planner_data or {}
        for key, md in metadata.state_dict_metadata.items():
            value = torch.empty(md.size, dtype=md.properties.dtype) if isinstance(md, TensorStorageMetadata) else md
            set_element(state_dict, paths.get(key, (key,)), value)
        super().set_up_planner(state_dict, metadata, is_coordinator)


def dcp_to_torch_save(dcp_checkpoint_dir: str | os.PathLike, torch_save_path: str | os.PathLike) -> None:
    """The whole DCP checkpoint at ``dcp_checkpoint_dir`` as one ``torch.save`` file (one process)."""
    state_dict: STATE_DICT_TYPE = {}
    _load_state_dict(state_dict, FileSystemReader(dcp_checkpoint_dir), no_dist=True,
                     planner=_EmptyStateDictLoadPlanner())
    torch.save(state_dict, torch_save_path)


def torch_save_to_dcp(torch_save_path: str | os.PathLike, dcp_checkpoint_dir: str | os.PathLike) -> None:
    """The ``torch.save`` file at ``torch_save_path`` as a DCP checkpoint in ``dcp_checkpoint_dir`` (one process)."""
    state_dict = torch.load(torch_save_path, weights_only=False)
    _save_state_dict(state_dict, FileSystemWriter(dcp_checkpoint_dir), no_dist=True)


class BroadcastingTorchSaveReader(StorageReader):
    """A ``torch.save`` file as a DCP storage: the coordinator loads it and broadcasts each requested tensor;
    tensors only (use with ``DynamicMetaLoadPlanner``, which takes the metadata from the state dict)."""

    def __init__(self, checkpoint_id: str | os.PathLike | None = None, coordinator_rank: int = 0) -> None:
        self.checkpoint_id, self.coordinator_rank = checkpoint_id, coordinator_rank

    def read_metadata(self) -> Metadata:
        return Metadata(state_dict_metadata={})  # the planner makes it from the state dict

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator
        if is_coordinator and c10d.get_rank() != self.coordinator_rank:
            raise AssertionError(f"Coordinator rank mismatch: expected {self.coordinator_rank}, got "
                                 f"{c10d.get_rank()}")
        if self.checkpoint_id is None:
            raise AssertionError("checkpoint_id must be set before setting up storage reader")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        planner = cast(DefaultLoadPlanner, planner)
        saved = None
        if self.is_coordinator:
            saved = torch.load(self.checkpoint_id, map_location="cpu", weights_only=False)
            if planner.flatten_state_dict:
                saved, _ = flatten_state_dict(saved)
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                raise RuntimeError(f"Non-tensor value identified at {req.storage_index.fqn}. At this time "
                                   f"{type(self).__name__} only supports loading Tensors.")
            fqn, md = req.storage_index.fqn, planner.metadata.state_dict_metadata[req.storage_index.fqn]
            # the whole tensor on every rank (plain, even for a DTensor value), then this rank's part of it: the
            # chunk's global offset (a DTensor's local shard) plus the offset within it
            whole = saved[fqn].contiguous() if self.is_coordinator else torch.empty(md.size,
                                                                                    dtype=md.properties.dtype)
            c10d.broadcast(whole, src=self.coordinator_rank)
            offsets = [a + b for a, b in zip(req.storage_index.offset or [0] * len(req.lengths), req.storage_offsets)]
            tensor = narrow_tensor_by_index(whole, offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise AssertionError(f"req {req.storage_index} mismatch sizes, {target.size()} vs {tensor.size()}")
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.checkpoint_id = checkpoint_id

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return os.path.isfile(checkpoint_id)


class DynamicMetaLoadPlanner(DefaultLoadPlanner):
    """A load planner whose checkpoint metadata is the state dict's own (each tensor one whole chunk), for a
    storage that has none (``BroadcastingTorchSaveReader``)."""

    def set_up_planner(self, state_dict: STATE_DICT_TYPE, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        described = {}
        for key, tensor in self.state_dict.items():
            if not torch.is_tensor(tensor):
                raise RuntimeError(f"Non-tensor value identified at {key}. At this time {type(self).__name__} only "
                                   "supports loading Tensors.")
            described[key] = TensorStorageMetadata(TensorProperties(dtype=tensor.dtype), tensor.size(),
                                                   _create_chunk_list(tensor))
        self.metadata = Metadata(state_dict_metadata=described)
