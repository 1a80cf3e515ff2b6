"""Contiguous parameter and gradient buffers split into buckets (``distributed/param_and_grad_buffer.py``).

Every parameter's ``.data`` and ``.main_grad`` become views into two flat tensors, so one collective per
bucket syncs many parameters. Parameters are laid out in reverse registration order (roughly the order
backward produces their gradients), and with the distributed optimizer each bucket is padded to a multiple
of the data-parallel size so it splits into equal shards for reduce-scatter / all-gather.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class Bucket:
    """A contiguous slice ``[offset, offset + numel)`` of the buffers holding whole parameters."""

    def __init__(self, params, param_data, grad_data, offset: int, data_parallel_group, data_parallel_world_size):
        self.params = list(params)
        self.param_data, self.grad_data, self.offset = param_data, grad_data, offset
        self.data_parallel_group, self.data_parallel_world_size = data_parallel_group, data_parallel_world_size
        self.reset()

    def reset(self) -> None:
        self.params_with_grad: set = set()
        self.communication_handle = None

    def shard_range(self, dp_rank: int) -> tuple[int, int]:
        size = self.grad_data.numel() // self.data_parallel_world_size
        return dp_rank * size, (dp_rank + 1) * size


class ParamAndGradBuffer:
    def __init__(self, params, data_parallel_group, bucket_size: int | None, use_distributed_optimizer: bool,
                 grad_dtype=torch.float32):
        self.params = [p for p in reversed(list(params)) if p.requires_grad]
        self.data_parallel_group = data_parallel_group
        self.dp = dist.get_world_size(data_parallel_group)
        pad_to = self.dp if use_distributed_optimizer else 1
        # assign parameters to buckets: close a bucket once it reaches bucket_size elements
        groups, current, size = [], [], 0
        for p in self.params:
            if getattr(p, "shared_embedding", False):
                # the tied embedding is all-reduced across the first and last stage after the DP sync; in its
                # own bucket it gets the same DP shard layout on both stages, so that sum stays exact
                if current:
                    groups.append(current)
                groups.append([p])
                current, size = [], 0
                continue
            current.append(p)
            size += p.numel()
            if bucket_size is not None and size >= bucket_size:
                groups.append(current)
                current, size = [], 0
        if current:
            groups.append(current)
        bucket_sizes = [math.ceil(sum(p.numel() for p in g) / pad_to) * pad_to for g in groups]
        self.numel = sum(bucket_sizes)
        dtype = self.params[0].dtype if self.params else torch.float32
        device = self.params[0].device if self.params else torch.device("cpu")
        self.param_data = torch.zeros(self.numel, dtype=dtype, device=device)
        self.grad_data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        self.param_index_map: dict = {}
        self.buckets: list[Bucket] = []
        offset = 0
        for group, bucket_numel in zip(groups, bucket_sizes):
            start = offset
            for p in group:
                n = p.numel()
                self.param_index_map[p] = (offset, offset + n)
                view = self.param_data[offset:offset + n].view_as(p)
                view.copy_(p.data)
                p.data = view
                p.main_grad = self.grad_data[offset:offset + n].view_as(p)
                offset += n
            offset = start + bucket_numel
            self.buckets.append(Bucket(group, self.param_data[start:offset], self.grad_data[start:offset], start,
                                       data_parallel_group, self.dp))
        self.param_to_bucket = {p: b for b in self.buckets for p in b.params}

    def reset(self) -> None:
        self.grad_data.zero_()
        for b in self.buckets:
            b.reset()
