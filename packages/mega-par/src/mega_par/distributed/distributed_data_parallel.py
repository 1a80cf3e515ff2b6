"""Megatron's ``DistributedDataParallel``: gradients accumulate into a contiguous buffer (``param.main_grad``)
and are averaged over the data-parallel group bucket by bucket.

Without the distributed optimizer each bucket is all-reduced; with it, reduce-scattered so each DP rank
holds the summed gradient only for the shard of parameters it updates (ZeRO-1, Rajbhandari et al.
arXiv 1910.02054; Megatron's distributed optimizer). With ``overlap_grad_reduce`` a bucket's collective is
launched asynchronously as soon as the last micro-batch's backward has produced all its gradients.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from mega_par import parallel_state as ps
from mega_par.distributed.param_and_grad_buffer import ParamAndGradBuffer


@dataclass
class DistributedDataParallelConfig:
    grad_reduce_in_fp32: bool = True
    overlap_grad_reduce: bool = False
    use_distributed_optimizer: bool = False
    bucket_size: int | None = None  # elements per bucket; None = one bucket
    average_in_collective: bool = False  # False: scale by 1/dp before a SUM (Megatron's default)

    def __post_init__(self):
        if self.bucket_size is not None and self.bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of elements or None, got {self.bucket_size}")


class DistributedDataParallel(nn.Module):
    def __init__(self, config, ddp_config: DistributedDataParallelConfig, module: nn.Module,
                 data_parallel_group=None):
        super().__init__()
        self.config, self.ddp_config, self.module = config, ddp_config, module
        self.data_parallel_group = data_parallel_group or ps.get_data_parallel_group()
        self.dp = dist.get_world_size(self.data_parallel_group)
        grad_dtype = torch.float32 if ddp_config.grad_reduce_in_fp32 else None
        params = list(module.parameters())
        self.buffer = ParamAndGradBuffer(params, self.data_parallel_group, ddp_config.bucket_size,
                                         ddp_config.use_distributed_optimizer,
                                         grad_dtype or (params[0].dtype if params else torch.float32))
        self.is_last_microbatch = True
        for p in self.buffer.params:
            p.register_post_accumulate_grad_hook(self._make_hook())

    def _make_hook(self):
        def hook(param):
            # move the autograd gradient into the contiguous buffer (accumulating over micro-batches)
            param.main_grad.add_(param.grad)
            param.grad = None
            if self.ddp_config.overlap_grad_reduce and self.is_last_microbatch:
                bucket = self.buffer.param_to_bucket[param]
                bucket.params_with_grad.add(param)
                if len(bucket.params_with_grad) == len(bucket.params):
                    self._start_bucket_sync(bucket, async_op=True)
        return hook

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def set_input_tensor(self, input_tensor) -> None:
        self.module.set_input_tensor(input_tensor)

    @contextlib.contextmanager
    def no_sync(self):
        """Skip launching gradient collectives during the enclosed (non-final) micro-batches."""
        self.is_last_microbatch = False
        try:
            yield
        finally:
            self.is_last_microbatch = True

    def _start_bucket_sync(self, bucket, async_op: bool) -> None:
        if bucket.communication_handle is not None or self.dp == 1:
            return
        if self.ddp_config.average_in_collective:
            op = dist.ReduceOp.AVG
        else:
            bucket.grad_data.mul_(1.0 / self.dp)
            op = dist.ReduceOp.SUM
        if self.ddp_config.use_distributed_optimizer:
            start, end = bucket.shard_range(dist.get_rank(self.data_parallel_group))
            # in place: this rank's shard of the bucket receives the reduced values
            shard = torch.empty(end - start, dtype=bucket.grad_data.dtype)
            work = dist.reduce_scatter_tensor(shard, bucket.grad_data, op=op, group=self.data_parallel_group,
                                              async_op=async_op)
            bucket.communication_handle = (work, shard, start, end)
        else:
            work = dist.all_reduce(bucket.grad_data, op=op, group=self.data_parallel_group, async_op=async_op)
            bucket.communication_handle = (work, None, 0, 0)

    def start_grad_sync(self) -> None:
        for bucket in self.buffer.buckets:
            self._start_bucket_sync(bucket, async_op=True)

    def finish_grad_sync(self) -> None:
        """Wait for (or launch, then wait for) every bucket's collective."""
        for bucket in self.buffer.buckets:
            self._start_bucket_sync(bucket, async_op=False)
            if bucket.communication_handle is None:
                continue
            work, shard, start, end = bucket.communication_handle
            if work is not None:
                work.wait()
            if shard is not None:
                bucket.grad_data[start:end].copy_(shard)

    def scale_gradients(self, scaling_factor: float) -> None:
        """Multiply every gradient in the buffer by ``scaling_factor`` (Megatron's, e.g. 1 / tokens)."""
        self.buffer.grad_data.mul_(scaling_factor)

    def zero_grad_buffer(self) -> None:
        self.buffer.reset()
        for p in self.buffer.params:
            p.grad = None

    def broadcast_params(self) -> None:
        """Make DP replicas start from identical weights (those of DP rank 0)."""
        if self.dp > 1:
            src = dist.get_global_rank(self.data_parallel_group, 0)
            dist.broadcast(self.buffer.param_data, src=src, group=self.data_parallel_group)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)
