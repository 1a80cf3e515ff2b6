"""``broadcast_data`` (``megatron/core/tensor_parallel/data.py``): the first rank of each tensor-parallel group reads
the batch and sends it to the others, so TP ranks compute on the same tokens. Shapes go first (up to 5 dimensions
per tensor, as Megatron's), then one flat buffer of all the tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps

_MAX_DATA_DIM = 5


def broadcast_data(keys, data, datatype, tp_group=None) -> dict:
    """``{key: tensor}`` on every rank of ``tp_group`` (default parallel_state's), from its first rank's ``data``
    (every tensor of ``datatype``); the other ranks' ``data`` is not read."""
    group = ps.get_tensor_model_parallel_group() if tp_group is None else tp_group
    src = dist.get_process_group_ranks(group)[0]
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend(group) == "nccl" else torch.device("cpu")
    sizes = torch.zeros(len(keys) * _MAX_DATA_DIM, dtype=torch.long, device=device)
    if dist.get_rank(group) == 0:
        for i, key in enumerate(keys):
            t = data[key]
            if t.dim() >= _MAX_DATA_DIM:
                raise ValueError(f"broadcast_data: {key} has {t.dim()} dimensions, at most {_MAX_DATA_DIM - 1}")
            if t.dtype != datatype:
                raise TypeError(f"{key} has data type {t.dtype} which is different than {datatype}")
            sizes[i * _MAX_DATA_DIM:i * _MAX_DATA_DIM + t.dim()] = torch.tensor(t.shape)
    dist.broadcast(sizes, src, group=group)
    shapes = [[int(s) for s in row if s > 0] for row in sizes.view(len(keys), _MAX_DATA_DIM).tolist()]
    numels = [int(torch.tensor(s).prod()) for s in shapes]
    if dist.get_rank(group) == 0:
        flat = torch.cat([data[k].to(device).contiguous().view(-1) for k in keys])
    else:
        flat = torch.empty(sum(numels), dtype=datatype, device=device)
    dist.broadcast(flat, src, group=group)
    return {k: piece.view(shape) for k, piece, shape in zip(keys, flat.split(numels), shapes)}
