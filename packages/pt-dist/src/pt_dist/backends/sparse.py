"""Sparse all-reduce, as c10d's gloo group does it: what DDP needs for ``nn.Embedding(sparse=True)`` gradients.

A sparse COO tensor has no fixed layout to reduce slice by slice, so every rank gathers what all ranks hold
and sums the union (ProcessGroupGloo's AsyncSparseAllreduceWork): all-gather the nnz counts, then the
indices and the values padded to the largest count, then coalesce (entries at one index add up). Traffic
grows with the total nnz, not the dense size. The result replaces the tensor's contents in place.
"""

from __future__ import annotations

import torch

from pt_dist.process_group import ReduceOp


def check_sparse_all_reduce(tensor: torch.Tensor, op: ReduceOp) -> None:
    """Before any communication, as gloo: COO layout, CPU, ``ReduceOp.SUM`` only."""
    if tensor.layout != torch.sparse_coo:
        raise ValueError(f"all_reduce: sparse layout {tensor.layout} is not supported; use a COO tensor "
                         f"(.to_sparse()) or a dense one")
    if op is not ReduceOp.SUM:
        raise ValueError(f"all_reduce of a sparse tensor supports ReduceOp.SUM only (as gloo), got ReduceOp.{op.name}")


def sparse_header(tensor: torch.Tensor) -> str:
    return f"sparse|{tensor.dtype}{list(tensor.shape)}|sparse_dim={tensor.sparse_dim()}"


def sparse_all_reduce(pg, tensor: torch.Tensor) -> list[torch.Tensor]:
    """The collective's body on a native group ``pg``: three all-gathers, fenced (shm's staging slots may be reused
    by the next gather only once every rank has read them)."""
    local = tensor.detach().coalesce()
    size, nnz, sd = pg.size(), local._nnz(), local.sparse_dim()
    counts = torch.empty(size, dtype=torch.int64)
    pg._all_gather(counts, torch.tensor([nnz], dtype=torch.int64))
    width = int(counts.max())
    indices = torch.zeros(sd, width, dtype=torch.int64)
    indices[:, :nnz] = local.indices()
    values = torch.zeros((width, *local.shape[sd:]), dtype=local.dtype)
    values[:nnz] = local.values()
    gathered = []
    for part in (indices, values):
        out = torch.empty(size * part.numel(), dtype=part.dtype)
        pg._fence()
        pg._all_gather(out, part.view(-1))
        gathered.append(out.view(size, *part.shape))
    all_indices = torch.cat([gathered[0][j, :, :n] for j, n in enumerate(counts.tolist())], dim=1)
    all_values = torch.cat([gathered[1][j, :n] for j, n in enumerate(counts.tolist())])
    total = torch.sparse_coo_tensor(all_indices, all_values, tensor.shape).coalesce()
    tensor.copy_(total)
    return [tensor]
