"""Turning a module's state dict into ``ShardedTensor``s (``megatron/core/transformer/utils.py``:
``make_sharded_tensors_for_checkpoint`` and its two helpers, upstream's signatures).

A TP-split tensor is chunk ``tp_rank`` of ``tp_size`` along its partition axis; anything else is replicated
over TP, and every copy but TP rank 0's is a non-main replica. DP ranks hold replicas too (``replica_id``'s
last entry). ``sharded_offsets`` prepend axes, e.g. the layer index ``(0, global_layer, num_layers)``.
"""

from __future__ import annotations

import torch

from mega_par import parallel_state as ps
from mega_par.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory


def _dp_rank() -> int:
    return ps.get_data_parallel_rank() if ps.model_parallel_is_initialized() else 0


def _tp() -> tuple[int, int]:
    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def make_tp_sharded_tensor_for_checkpoint(tensor, key, tp_axis=0, replica_id=None, prepend_offsets=(), **kwargs):
    """Chunk ``tp_rank`` of ``tp_size`` along ``tp_axis`` (of the local tensor)."""
    tp_rank, tp_size = _tp()
    if replica_id is None:
        replica_id = (0, 0, _dp_rank())
    return ShardedTensor.from_rank_offsets(key, tensor, *prepend_offsets,
                                           (tp_axis + len(prepend_offsets), tp_rank, tp_size),
                                           replica_id=replica_id, prepend_axis_num=len(prepend_offsets), **kwargs)


def make_sharded_tensor_for_checkpoint(tensor, key, prepend_offsets=(), replica_id=None, **kwargs):
    """Replicated over TP: TP rank 0 holds the main replica."""
    if replica_id is None:
        replica_id = (0, _tp()[0], _dp_rank())
    return ShardedTensor.from_rank_offsets(key, tensor, *prepend_offsets, replica_id=replica_id,
                                           prepend_axis_num=len(prepend_offsets), **kwargs)


def make_strided_tp_sharded_factory(tensor, key, tp_axis, stride, prepend_offsets=()):
    """A TP shard of a ``stride``-interleaved weight (SwiGLU's ``[gate; up]``, stride 2) is ``stride`` slices,
    one per sub-matrix: saved as ShardedTensors ``key/0`` .. of the sub-matrices (upstream's
    ``apply_swiglu_sharded_factory`` in ``mlp.py``), so it reshards to any TP size."""
    def build(key, data, replica_id, flattened_range):
        return {str(i): make_tp_sharded_tensor_for_checkpoint(chunk, f"{key}/{i}", tp_axis, replica_id,
                                                              prepend_offsets)
                for i, chunk in enumerate(torch.chunk(data, stride, dim=tp_axis))}

    def merge(loaded: dict):
        return torch.cat([loaded[str(i)] for i in range(stride)], dim=tp_axis)

    return ShardedTensorFactory(key, tensor, build, merge, replica_id=(0, 0, _dp_rank()))


def make_sharded_tensors_for_checkpoint(state_dict, prefix, tensor_parallel_layers_axis_map=None, sharded_offsets=(),
                                        extra_state_suffix="_extra_state", tp_group=None):
    """``{prefix + name: ShardedTensor}``; names in ``tensor_parallel_layers_axis_map`` are TP-split along the
    mapped axis (a tensor with ``partition_stride > 1`` through the strided factory), the rest replicated."""
    if tp_group is not None:
        raise ValueError(f"make_sharded_tensors_for_checkpoint: tp_group={tp_group!r} is not supported "
                         "(the parallel_state TP group is used)")
    axis_map = tensor_parallel_layers_axis_map or {}
    out = {}
    for name, tensor in state_dict.items():
        key = f"{prefix}{name}"
        if name.endswith(extra_state_suffix):
            raise ValueError(f"{key}: extra state is not supported by mega_par's dist_checkpointing")
        if name in axis_map and getattr(tensor, "partition_stride", 1) > 1:
            out[key] = make_strided_tp_sharded_factory(tensor, key, axis_map[name], tensor.partition_stride,
                                                        sharded_offsets)
        elif name in axis_map:
            out[key] = make_tp_sharded_tensor_for_checkpoint(tensor, key, axis_map[name],
                                                             prepend_offsets=sharded_offsets)
        else:
            out[key] = make_sharded_tensor_for_checkpoint(tensor, key, prepend_offsets=sharded_offsets)
    return out


def sharded_state_dict_default(module: torch.nn.Module, prefix: str = "", sharded_offsets: tuple = (),
                               metadata: dict | None = None, tp_group=None) -> dict:
    """The module's own ``sharded_state_dict`` if it has one, else its state dict with the TP-split parameters
    chunked along their ``partition_dim`` (mega_par's parallel layers mark them; Megatron's carry their own)."""
    if hasattr(module, "sharded_state_dict"):
        return module.sharded_state_dict(prefix=prefix, sharded_offsets=sharded_offsets, metadata=metadata)
    return make_sharded_tensors_for_checkpoint(module.state_dict(keep_vars=True), prefix, tp_axis_map(module),
                                               sharded_offsets, tp_group=tp_group)


def tp_axis_map(module: torch.nn.Module) -> dict:
    """name -> partition_dim for the module's TP-split parameters (mega_par's layers mark them, as Megatron's)."""
    return {n: p.partition_dim for n, p in module.named_parameters() if getattr(p, "tensor_model_parallel", False)}


def replace_prefix_for_sharding(sharded_state_dict: dict, old_prefix: str, new_prefix: str) -> None:
    """Rename the checkpoint keys (not the dict keys), e.g. ``decoder.layers.3.`` -> ``decoder.layers.``."""
    for sh in sharded_state_dict.values():
        if not sh.key.startswith(old_prefix):
            raise ValueError(f"expected key {sh.key!r} to start with {old_prefix!r}")
        sh.key = f"{new_prefix}{sh.key[len(old_prefix):]}"
