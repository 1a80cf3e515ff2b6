"""Gradient buckets: which parameters share a flat buffer, the buffer and its views, and the ``GradBucket`` hooks see.

torch's ``compute_bucket_assignment_by_size`` (torch/csrc/distributed/c10d/reducer.cpp) and ``GradBucket``
(c10d/comm.hpp). Buckets hold one dtype and device each and close once they reach their size limit; the
limits are used in order and the last one repeats, which is how DDP makes its first bucket small (1 MiB,
``_DEFAULT_FIRST_BUCKET_BYTES``): the first bucket to fill can start communicating early.
"""

from __future__ import annotations

import torch

_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


def _compute_bucket_assignment_by_size(tensors, bucket_size_limits, expect_sparse_gradient=None,
                                       tensor_indices=None):
    """``(bucket_indices, per_bucket_size_limits)`` as torch's: ``tensors`` walked in their order, ``tensors[i]``
    called ``tensor_indices[i]`` (default ``i``), a bucket per (dtype, device) closed once it holds its limit or
    more. Without ``tensor_indices`` the buckets are sorted by their smallest index (so they fill in order)."""
    if not bucket_size_limits or any(not limit > 0 for limit in bucket_size_limits):
        raise ValueError(f"bucket_size_limits must be positive byte counts, got {bucket_size_limits!r}")
    labels = list(range(len(tensors))) if tensor_indices is None else list(tensor_indices)
    if len(labels) != len(tensors):
        raise ValueError(f"tensor_indices must label each of the {len(tensors)} tensors, got {len(labels)}")
    result: list[tuple[list[int], int]] = []
    open_buckets: dict[tuple, list] = {}  # (dtype, device) -> [indices, bytes, position in the limits]
    for t, i in zip(tensors, labels):
        if (expect_sparse_gradient and expect_sparse_gradient[i]) or t.is_sparse:  # a sparse gradient goes alone
            result.append(([i], 0))
            continue
        key = (t.dtype, t.device)
        bucket = open_buckets.setdefault(key, [[], 0, 0])
        bucket[0].append(i)
        bucket[1] += t.numel() * t.element_size()
        limit = bucket_size_limits[min(bucket[2], len(bucket_size_limits) - 1)]
        if bucket[1] >= limit:
            result.append((bucket[0], limit))
            open_buckets[key] = [[], 0, bucket[2] + 1]
    for bucket in open_buckets.values():
        if bucket[0]:
            result.append((bucket[0], bucket_size_limits[min(bucket[2], len(bucket_size_limits) - 1)]))
    if tensor_indices is None:
        result.sort(key=lambda r: min(r[0]))
    return [r[0] for r in result], [r[1] for r in result]


class Bucket:
    """One flat buffer and the view of it each of its parameters' gradients is copied into (reducer.h's Bucket);
    ``zeros(numel, dtype=, device=)`` allocates the buffer."""

    def __init__(self, index: int, params: list[torch.Tensor], param_indices: list[int], size_limit: int,
                 zeros=torch.zeros):
        dtypes = {(p.dtype, p.device) for p in params}
        if len(dtypes) != 1:
            raise RuntimeError(f"bucket {index}: all parameters in a bucket must have the same dtype and device, got "
                               f"{sorted(str(d) for d, _ in dtypes)}")
        self.index, self.param_indices, self.size_limit = index, param_indices, size_limit
        self.lengths = [p.numel() for p in params]
        self.offsets = [sum(self.lengths[:k]) for k in range(len(params))]
        self.buffer = zeros(sum(self.lengths), dtype=params[0].dtype, device=params[0].device)
        self.views = [self.buffer.narrow(0, off, n).view(p.shape)
                      for off, n, p in zip(self.offsets, self.lengths, params)]
        self.params = params
        self.pending = len(params)  # gradients still to come this iteration
        self.future: torch.futures.Future | None = None


class GradBucket:
    """What a comm hook gets (torch.distributed.GradBucket): the flat buffer of one bucket and its parameters."""

    def __init__(self, bucket: Bucket, is_last: bool):
        self._bucket, self._buffer, self._is_last = bucket, bucket.buffer, is_last

    def index(self) -> int:
        return self._bucket.index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """What later ``buffer()`` calls return (torch's compression wrappers swap in a low-precision copy)."""
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        """The gradients as views of the flat buffer, in the parameters' shapes."""
        return list(self._bucket.views)

    def parameters(self) -> list[torch.Tensor]:
        return list(self._bucket.params)

    def is_last(self) -> bool:
        """Whether this is the last bucket of the iteration to be reduced."""
        return self._is_last


def bucket_allocator(process_group, params):
    """How buckets get their buffers: on an shm group whose symmetric heap has room for them and for their
    rebuild, from the heap (its all-reduce then loads and stores peers' buckets directly, no kernel copies);
    plain tensors otherwise. Every rank decides alike: the heap's use is the same wherever allocations were."""
    free = getattr(process_group, "symmetric_free_bytes", None)
    need = 2 * sum(p.numel() * p.element_size() + 4096 for p in params)  # each bucket page-aligned
    if free is None or process_group.size() == 1 or any(p.device.type != "cpu" for p in params) or free() < need:
        return torch.zeros

    def zeros(numel, dtype, device):
        return process_group.symmetric_empty(numel, dtype=dtype).zero_()
    return zeros
