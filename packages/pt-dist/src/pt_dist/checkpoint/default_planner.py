"""The default planners (torch/distributed/checkpoint/default_planner.py).

Save: flatten the nested state dict; each rank's local plan offers every value it holds (plain tensors and
objects on every rank, its DTensor blocks); the coordinator dedups the offers, builds the ``Metadata`` (per key
its global size and the list of chunks) and checks the chunks tile each tensor; each rank then writes what it
was left. Load: each rank asks, per key of *its* state dict, for the overlaps of its local chunks with the saved
chunks (``planner_helpers.create_read_items_for_chunk_list``): no global step is needed, which is why a
checkpoint loads at any world size and into any sharding.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from typing import Any

import torch

from pt_dist._infra.chunk_checks import tiling_errors

from ._dedup_save_plans import dedup_save_plans
from ._nested_dict import flatten_state_dict, set_element
from .metadata import STATE_DICT_TYPE, BytesStorageMetadata, Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from .planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem, WriteItemType
from .planner_helpers import _create_read_items, _create_write_items, _holds_shard
from .utils import find_state_dict_object, narrow_tensor_by_index

logger = logging.getLogger(__name__)

__all__ = ["DefaultLoadPlanner", "DefaultSavePlanner", "create_default_global_load_plan",
           "create_default_global_save_plan", "create_default_local_load_plan", "create_default_local_save_plan"]


class DefaultSavePlanner(SavePlanner):
    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 dedup_replicated_tensors: bool | None = None, dedup_save_to_lowest_rank: bool = False,
                 enable_plan_caching: bool = False) -> None:
        """``flatten_sharded_tensors`` re-chunks torch's nested ShardedTensors (2-D FSDP), which pt_dist has none
        of: either value plans the same. ``dedup_replicated_tensors`` is deprecated in torch (no effect)."""
        if enable_plan_caching:
            raise ValueError("DefaultSavePlanner(enable_plan_caching=True) is not supported by pt_dist: every save "
                             "plans afresh")
        if dedup_replicated_tensors is not None:
            logger.warning("DefaultSavePlanner's `dedup_replicated_tensors` argument is being deprecated, and no "
                           "longer has any effect. Please remove this argument from your call.")
        self.flatten_state_dict, self.flatten_sharded_tensors = flatten_state_dict, flatten_sharded_tensors
        self.dedup_save_to_lowest_rank, self.mappings = dedup_save_to_lowest_rank, {}

    def set_up_planner(self, state_dict: STATE_DICT_TYPE, storage_meta: StorageMeta | None = None,
                       is_coordinator: bool = False) -> None:
        if self.flatten_state_dict:
            state_dict, self.mappings = flatten_state_dict(state_dict)
        self.state_dict, self.is_coordinator = state_dict, is_coordinator

    def create_local_plan(self) -> SavePlan:
        self.plan = create_default_local_save_plan(self.state_dict, self.is_coordinator)
        if self.flatten_state_dict:  # (the nested-dict paths of the flat keys, for load to rebuild the nesting)
            self.plan = dataclasses.replace(self.plan, planner_data=self.mappings)
        return self.plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        global_plan, metadata = create_default_global_save_plan(
            dedup_save_plans(all_plans, self.dedup_save_to_lowest_rank))
        if self.flatten_state_dict:
            merged = {k: path for p in global_plan for k, path in (p.planner_data or {}).items()}
            metadata = dataclasses.replace(metadata, planner_data=merged)
        errors = _validate_global_plan(global_plan, metadata)
        if errors:
            raise ValueError(f"Failed to validate global plan: {'; '.join(errors)[:500]}")
        self.global_plan, self.metadata = global_plan, metadata
        return global_plan, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.plan = new_plan
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        return self.transform_object(write_item, self.lookup_object(write_item.index))

    def lookup_object(self, index: MetadataIndex) -> Any:
        return find_state_dict_object(self.state_dict, index)

    def transform_object(self, write_item: WriteItem, object: Any):
        if write_item.type != WriteItemType.BYTE_IO:
            return object
        buf = io.BytesIO()
        torch.save(object, buf)
        return buf


class DefaultLoadPlanner(LoadPlanner):
    """``allow_partial_load``: keys of the state dict the checkpoint lacks are left as they are (else an error)."""

    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 allow_partial_load: bool = False) -> None:
        self.flatten_state_dict, self.flatten_sharded_tensors = flatten_state_dict, flatten_sharded_tensors
        self.allow_partial_load, self.original_state_dict, self.mappings = allow_partial_load, {}, {}

    def set_up_planner(self, state_dict: STATE_DICT_TYPE, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        self.original_state_dict = state_dict
        if self.flatten_state_dict:
            state_dict, self.mappings = flatten_state_dict(state_dict)
        self.state_dict, self.metadata, self.is_coordinator = state_dict, metadata, is_coordinator

    def create_local_plan(self) -> LoadPlan:
        if self.metadata is None:
            raise AssertionError("DefaultLoadPlanner.create_local_plan: set_up_planner got no metadata")
        return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        return new_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=False)  # (a pickled object, as torch's; the checkpoint is trusted)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.transform_tensor(read_item, self.lookup_tensor(read_item.dest_index))

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor handed out a view of the state dict's own tensor: already in place

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return find_state_dict_object(self.state_dict, index)

    def transform_tensor(self, read_item: ReadItem, tensor: torch.Tensor):
        return narrow_tensor_by_index(tensor, read_item.dest_offsets, read_item.lengths)


def create_default_local_save_plan(state_dict: dict[str, Any], is_coordinator: bool) -> SavePlan:
    """Every value this rank holds (the coordinator's dedup decides who writes a replicated one)."""
    return SavePlan([item for fqn, obj in state_dict.items() if _holds_shard(obj)
                     for item in _create_write_items(fqn, obj)])


def create_default_global_save_plan(all_plans: list[SavePlan],
                                    rewrite_index_hints: bool = True) -> tuple[list[SavePlan], Metadata]:
    """The ``Metadata``: per key, bytes, or the global size and every chunk the ranks write."""
    md: dict = {}
    new_plans = []
    for plan in all_plans:
        new_items = []
        for item in plan.items:
            if item.type != WriteItemType.SHARD and item.index.fqn in md:
                raise AssertionError(f"{item.index.fqn!r} is written twice (two ranks with different values?)")
            if item.type == WriteItemType.BYTE_IO:
                md[item.index.fqn] = BytesStorageMetadata()
            else:
                tmd = md.setdefault(item.index.fqn, TensorStorageMetadata(
                    properties=item.tensor_data.properties, size=item.tensor_data.size, chunks=[]))
                if rewrite_index_hints:
                    item = dataclasses.replace(item, index=dataclasses.replace(item.index, index=len(tmd.chunks)))
                tmd.chunks.append(item.tensor_data.chunk)
            new_items.append(item)
        new_plans.append(dataclasses.replace(plan, items=new_items))
    return new_plans, Metadata(md)


def create_default_local_load_plan(state_dict: dict[str, Any], metadata: Metadata, strict: bool = True) -> LoadPlan:
    """Per key this rank holds: the reads that fill its chunk(s) from the saved chunks they overlap."""
    requests = []
    for fqn, obj in state_dict.items():
        if fqn not in metadata.state_dict_metadata:
            if strict:
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            continue
        md = metadata.state_dict_metadata[fqn]
        if isinstance(md, TensorStorageMetadata) and isinstance(obj, torch.Tensor) and md.size != obj.shape:
            raise ValueError(f"Size mismatch between saved {md.size} and current: {obj.shape} for {fqn}")
        if _holds_shard(obj):
            requests += _create_read_items(fqn, md, obj)
    return LoadPlan(requests)


def create_default_global_load_plan(all_plans: list[LoadPlan]) -> list[LoadPlan]:
    return all_plans  # each rank reads what it needs: nothing to coordinate


def _validate_global_plan(global_plan: list[SavePlan], metadata: Metadata) -> list[str]:
    """The chunks of each tensor lie inside it, do not overlap, and (with more than one rank) cover it."""
    return [error for key, value in metadata.state_dict_metadata.items()
            if isinstance(value, TensorStorageMetadata) and len(value.size) > 0
            for error in tiling_errors(key, value.size, value.chunks, must_cover=len(global_plan) > 1)]
