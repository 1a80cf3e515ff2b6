"""Items from state-dict values, and the resharding rule (torch's checkpoint/planner_helpers.py, resharding.py).

A plain tensor is one chunk at offset 0 (``TENSOR``: every rank that holds it offers it, the coordinator's dedup
keeps one); a DTensor is this rank's local block at its global offset (``SHARD``, from
``compute_local_shape_and_global_offset``); anything else is pickled bytes. Loading intersects each local chunk
with every saved chunk of that key: one ``ReadItem`` per overlap, so a checkpoint saved as 2 row blocks loads
as 4, or as 1 whole tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from pt_dist.tensor._api import DTensor
from pt_dist.tensor._utils import compute_local_shape_and_global_offset

from .metadata import BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex, TensorProperties, TensorStorageMetadata
from .planner import LoadItemType, ReadItem, TensorWriteData, WriteItem, WriteItemType

__all__ = ["create_read_items_for_chunk_list"]


def _holds_shard(obj) -> bool:
    """False for a DTensor on a mesh this rank is not part of (it has nothing of it to save or load)."""
    return not isinstance(obj, DTensor) or obj.device_mesh.get_coordinate() is not None


def _create_chunk_list(obj) -> list[ChunkStorageMetadata]:
    """The block this rank holds: a DTensor's local block at its global offset, a plain tensor whole."""
    if isinstance(obj, DTensor):
        sizes, offsets = compute_local_shape_and_global_offset(obj.shape, obj.device_mesh, obj.placements)
        return [ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))]
    if isinstance(obj, torch.Tensor):
        return [ChunkStorageMetadata(offsets=torch.Size([0] * obj.dim()), sizes=obj.size())]
    raise ValueError(f"expected a Tensor or DTensor, got {type(obj).__name__}")


def _create_write_items(fqn: str, obj: Any) -> list[WriteItem]:
    if not isinstance(obj, torch.Tensor):
        return [WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO)]
    chunk = _create_chunk_list(obj)[0]
    local, kind = (obj.to_local(), WriteItemType.SHARD) if isinstance(obj, DTensor) else (obj, WriteItemType.TENSOR)
    data = TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(local),
                           size=torch.Size(obj.shape))
    return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=kind, tensor_data=data)]


def _overlap(saved: ChunkStorageMetadata, local: ChunkStorageMetadata):
    """(offsets in the saved chunk, offsets in the local chunk, lengths), or None if the boxes do not meet."""
    storage, dest, lengths = [], [], []
    for s_off, s_len, l_off, l_len in zip(saved.offsets, saved.sizes, local.offsets, local.sizes):
        start, end = max(s_off, l_off), min(s_off + s_len, l_off + l_len)
        if end <= start:
            return None
        storage.append(start - s_off)
        dest.append(start - l_off)
        lengths.append(end - start)
    return storage, dest, lengths


def create_read_items_for_chunk_list(fqn: str, checkpoint_md: TensorStorageMetadata,
                                     local_chunks: list[ChunkStorageMetadata]) -> list[ReadItem]:
    """The reads that fill ``local_chunks`` from the saved chunks of ``checkpoint_md`` (every overlapping pair)."""
    items = []
    for local_idx, local in enumerate(local_chunks):
        for saved_idx, saved in enumerate(checkpoint_md.chunks):
            hit = _overlap(saved, local)
            if hit is None:
                continue
            storage, dest, lengths = hit
            items.append(ReadItem(type=LoadItemType.TENSOR,
                                  dest_index=MetadataIndex(fqn, local.offsets, local_idx),
                                  dest_offsets=torch.Size(dest),
                                  storage_index=MetadataIndex(fqn, saved.offsets, saved_idx),
                                  storage_offsets=torch.Size(storage),
                                  lengths=torch.Size(lengths)))
    return items


def _create_read_items(fqn: str, md, obj: Any) -> list[ReadItem]:
    if isinstance(md, BytesStorageMetadata):
        zero = torch.Size((0,))
        return [ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(fqn), dest_offsets=zero,
                         storage_index=MetadataIndex(fqn), storage_offsets=zero, lengths=zero)]
    try:
        local_chunks = _create_chunk_list(obj)
    except ValueError as e:
        raise ValueError(f"Invalid checkpoint metadata for {fqn}, expected BytesStorageMetadata but found "
                         f"{type(md).__name__}") from e
    return create_read_items_for_chunk_list(fqn, md, local_chunks)
