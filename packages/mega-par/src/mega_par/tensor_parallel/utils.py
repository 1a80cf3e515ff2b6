"""Tensor helpers of ``megatron/core/tensor_parallel/utils.py``: split a tensor for the TP ranks, and the vocabulary
range each rank's shard of a vocab-parallel embedding or output layer covers."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps


def split_tensor_along_last_dim(tensor: torch.Tensor, num_partitions: int, contiguous_split_chunks: bool = False):
    """``num_partitions`` equal pieces along the last dimension (views unless ``contiguous_split_chunks``)."""
    if tensor.shape[-1] % num_partitions:
        raise ValueError(f"last dimension {tensor.shape[-1]} is not divisible by num_partitions {num_partitions}")
    chunks = torch.split(tensor, tensor.shape[-1] // num_partitions, dim=-1)
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks


def split_tensor_into_1d_equal_chunks(tensor: torch.Tensor, new_buffer: bool = False) -> torch.Tensor:
    """This TP rank's piece of the flattened tensor (a copy with ``new_buffer``)."""
    flat = tensor.reshape(-1)
    size = ps.get_tensor_model_parallel_world_size()
    if flat.numel() % size:
        raise ValueError(f"{flat.numel()} elements are not divisible by the tensor-parallel size {size}")
    n = flat.numel() // size
    piece = flat[ps.get_tensor_model_parallel_rank() * n:][:n]
    return piece.clone() if new_buffer else piece


def gather_split_1d_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The inverse of ``split_tensor_into_1d_equal_chunks``: every TP rank's piece, flat, in rank order."""
    size = ps.get_tensor_model_parallel_world_size()
    out = torch.empty(tensor.numel() * size, dtype=tensor.dtype, device=tensor.device)
    dist.all_gather_into_tensor(out, tensor.contiguous().view(-1), group=ps.get_tensor_model_parallel_group())
    return out


class VocabUtility:
    """The ``[first, last)`` vocabulary ids a rank's shard holds when the vocabulary is split evenly."""

    @staticmethod
    def vocab_range_from_per_partition_vocab_size(per_partition_vocab_size: int, rank, world_size: int):
        first = rank * per_partition_vocab_size
        return first, first + per_partition_vocab_size

    @staticmethod
    def vocab_range_from_global_vocab_size(global_vocab_size: int, rank: int, world_size: int):
        if global_vocab_size % world_size:
            raise ValueError(f"vocabulary size {global_vocab_size} is not divisible by world_size {world_size}")
        return VocabUtility.vocab_range_from_per_partition_vocab_size(global_vocab_size // world_size, rank,
                                                                       world_size)
