"""Helpers DDP and FSDP share (torch's ``torch/distributed/utils.py``): syncing module states from one rank."""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d

__all__ = ["_broadcast_coalesced"]


def _packed(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _broadcast_coalesced(process_group, tensors, buffer_size: int, src: int = 0) -> None:
    """torch's (DDP's ``_sync_module_states`` at construction): group rank ``src``'s ``tensors`` into every rank's,
    packed per dtype into flat buffers of at most ``buffer_size`` bytes (a larger tensor alone), one async
    broadcast per buffer, all in flight at once."""
    if c10d._rank_not_in_group(process_group, "_broadcast_coalesced"):
        return
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"_broadcast_coalesced: buffer_size must be a positive int, got {buffer_size!r}")
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"_broadcast_coalesced: tensors must be a list of tensors, got {type(tensors).__name__}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            raise TypeError(f"_broadcast_coalesced: tensors[{i}] must be a dense torch.Tensor, got "
                            f"{getattr(t, 'layout', type(t).__name__)}")
    buckets: list[list[torch.Tensor]] = []
    filling: dict[torch.dtype, list] = {}  # dtype -> [its open bucket, bytes in it]
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        bucket = filling.get(t.dtype)
        if bucket is None or (bucket[0] and bucket[1] + nbytes > buffer_size):
            bucket = filling[t.dtype] = [[], 0]
            buckets.append(bucket[0])
        bucket[0].append(t)
        bucket[1] += nbytes
    flats = [_packed(bucket) for bucket in buckets]
    works = [c10d.broadcast(flat, group=process_group, async_op=True, group_src=src) for flat in flats]
    with torch.no_grad():
        for bucket, flat, work in zip(buckets, flats, works):
            work.wait()
            for t, piece in zip(bucket, flat.split([t.numel() for t in bucket])):
                t.copy_(piece.view(t.shape))
