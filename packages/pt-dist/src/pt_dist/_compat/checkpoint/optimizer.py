"""``load_sharded_optimizer_state_dict`` (torch/distributed/checkpoint/optimizer.py): the optimizer state saved
beside a model's sharded state dict (FSDP1 ``SHARDED_STATE_DICT``: ``{"model": model.state_dict(), "optim":
FSDP.optim_state_dict(model, optim)}``), read back as that nested dict with each per-element state a DTensor laid
out as its parameter is in ``model_state_dict`` (``Shard(0)`` over the world where the parameter is not a
DTensor), one-element states (``step``) plain tensors and the rest (``param_groups``) as saved; ready for
``FSDP.optim_state_dict_to_load``."""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.checkpoint.state_dict_loader import load
from pt_dist._compat.tensor.factories import zeros
from pt_dist.checkpoint._nested_dict import set_element
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE, BytesStorageMetadata
from pt_dist.checkpoint.planner import LoadPlanner
from pt_dist.checkpoint.storage import StorageReader
from pt_dist.device_mesh import init_device_mesh
from pt_dist.tensor import DTensor, Shard

__all__ = ["load_sharded_optimizer_state_dict"]


def load_sharded_optimizer_state_dict(model_state_dict: STATE_DICT_TYPE, optimizer_key: str,
                                      storage_reader: StorageReader, planner: LoadPlanner | None = None
                                      ) -> STATE_DICT_TYPE:
    """Collective: ``{optimizer_key: <the saved optimizer state dict>}``, each rank holding its parameters' rows."""
    metadata = storage_reader.read_metadata()
    if metadata.planner_data is None:
        raise ValueError("load_sharded_optimizer_state_dict: the checkpoint has no key paths (planner_data); save "
                         "it with the default planner")
    world_mesh = None
    flat: dict = {}
    for key, md in metadata.state_dict_metadata.items():
        path = metadata.planner_data[key]
        if path[0] != optimizer_key:
            continue
        if isinstance(md, BytesStorageMetadata):
            flat[key] = "<bytes_io>"  # (replaced by what was saved)
            continue
        dtype = md.properties.dtype
        like = model_state_dict.get(path[2]) if len(path) > 2 else None
        if md.size.numel() == 1:
            flat[key] = torch.empty(md.size, dtype=dtype)
        elif isinstance(like, DTensor) and like.shape == md.size:
            flat[key] = zeros(md.size, dtype=dtype, device_mesh=like.device_mesh, placements=like.placements)
        else:
            if world_mesh is None:
                world_mesh = init_device_mesh("cpu", (c10d.get_world_size(),))
            flat[key] = zeros(md.size, dtype=dtype, device_mesh=world_mesh, placements=[Shard(0)])
    load(flat, storage_reader=storage_reader, planner=planner)
    out: dict = {}
    for key, value in flat.items():
        set_element(out, metadata.planner_data[key], value)
    return out
