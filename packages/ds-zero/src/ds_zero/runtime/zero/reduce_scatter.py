"""Bucketed gradient reduction to the owning ranks, run from backward hooks (ZeRO section 5.2, P_os+g).

Gradients are copied into a bucket as autograd produces them; a full bucket is reduced so that each
rank receives only the pieces it owns, summed over ranks, and adds them into its gradient partition.
When every rank owns the same amount of the bucket (ZeRO-3's per-parameter chunks) that is one
``reduce_scatter``; otherwise (ZeRO-2's contiguous partitions) one ``reduce`` per owning rank, as
DeepSpeed's ``average_tensor`` does (on gloo an all-reduce of the bucket is faster, see
:func:`prefer_all_reduce`). With ``overlap_comm`` the collective runs asynchronously while
backward continues and is only waited for when the next bucket goes out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Set True to use the owner-only collectives on gloo as well (tests do, to cover both paths on CPU).
OWNER_ONLY_COLLECTIVES_ON_GLOO = False


def prefer_all_reduce(group=None) -> bool:
    """gloo's reduce_scatter/reduce are slower than its ring all_reduce on CPU (4.2M bf16 elements, 2 ranks:
    66 ms / 56 ms vs 45 ms on the benchmark machine), so there buckets are all-reduced and each rank keeps only
    its own pieces; on nccl the owner-only collectives are used."""
    return dist.get_backend(group) == "gloo" and not OWNER_ONLY_COLLECTIVES_ON_GLOO


class GradientBucketReducer:
    """``add(grad, pieces)``; ``pieces`` is a list of ``(dst_rank, src_lo, src_hi, dst_offset)`` on the flat grad."""

    def __init__(self, grad_partitions: list[torch.Tensor] | None, bucket_numel: int, dtype: torch.dtype,
                 overlap_comm: bool, group=None, deliver=None):
        """``deliver(partition_index, offset, reduced)`` receives this rank's share; by default it is added into
        ``grad_partitions`` (ZeRO-Offload passes one that streams it to host memory instead)."""
        self.grad_partitions = grad_partitions
        self.deliver = deliver or self._add_to_partition
        self.bucket_numel = max(1, int(bucket_numel))
        self.dtype = dtype
        self.overlap_comm = overlap_comm
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._entries: list = []  # (flat grad, pieces, partition index)
        self._numel = 0
        self._pending = None
        self.all_reduce_buckets = prefer_all_reduce(group)

    def add(self, grad: torch.Tensor, pieces: list, partition_index: int = 0) -> None:
        flat = grad.detach().reshape(-1)  # no copy: it is written once, into the send buffer, at flush
        size = sum(hi - lo for _, lo, hi, _ in pieces)
        if self._numel and self._numel + size > self.bucket_numel:
            self.flush()
        self._entries.append((flat, pieces, partition_index))
        self._numel += size
        if self._numel >= self.bucket_numel:
            self.flush()

    def flush(self) -> None:
        if not self._entries:
            return
        entries, self._entries, self._numel = self._entries, [], 0
        lengths = [0] * self.world_size
        mine = []  # (partition index, dst offset, length) in arrival order for this rank
        for _, pieces, pidx in entries:
            for dst, lo, hi, off in pieces:
                lengths[dst] += hi - lo
                if dst == self.rank:
                    mine.append((pidx, off, hi - lo))
        self.wait()
        device = entries[0][0].device
        balanced = len(set(lengths)) == 1
        if self.all_reduce_buckets or balanced:
            send = torch.empty(sum(lengths), dtype=self.dtype, device=device)
            rows = list(send.split(lengths))
        else:
            rows = [torch.empty(n, dtype=self.dtype, device=device) for n in lengths]
        cursor = [0] * self.world_size
        for flat, pieces, _ in entries:
            for dst, lo, hi, _ in pieces:
                out = rows[dst][cursor[dst]:cursor[dst] + hi - lo]
                cursor[dst] += hi - lo
                have = max(0, min(hi, flat.numel()) - lo)  # ZeRO-3's last chunk runs past the param: zeros
                # Pre-divide (as DeepSpeed does) so the sum over ranks is the mean and fp16 sums stay in range.
                torch.div(flat[lo:lo + have], self.world_size, out=out[:have])
                out[have:].zero_()
        if self.all_reduce_buckets:
            works = [dist.all_reduce(send, group=self.group, async_op=self.overlap_comm)]
            recv = rows[self.rank]
        elif balanced:
            recv = torch.empty(lengths[0], dtype=self.dtype, device=device)
            works = [dist.reduce_scatter_tensor(recv, send.view(-1), group=self.group, async_op=self.overlap_comm)]
        else:
            works, recv = [], None
            for dst, buf in enumerate(rows):
                if buf.numel() == 0:
                    continue
                works.append(dist.reduce(buf, dst=dist.get_global_rank(self.group, dst) if self.group else dst,
                                         group=self.group, async_op=self.overlap_comm))
                if dst == self.rank:
                    recv = buf
        self._pending = (works, recv, mine)
        if not self.overlap_comm:
            self.wait()

    def wait(self) -> None:
        """Finish the in-flight bucket and add this rank's share into its gradient partitions."""
        if self._pending is None:
            return
        works, recv, mine = self._pending
        self._pending = None
        for w in works:
            if w is not None:
                w.wait()
        cursor = 0
        for pidx, off, n in mine:
            self.deliver(pidx, off, recv[cursor:cursor + n])
            cursor += n

    def _add_to_partition(self, pidx: int, off: int, reduced: torch.Tensor) -> None:
        self.grad_partitions[pidx][off:off + reduced.numel()].add_(reduced)

    def finish(self) -> None:
        self.flush()
        self.wait()
