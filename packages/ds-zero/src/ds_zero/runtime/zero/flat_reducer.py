"""Stage 0/1 gradient reduction at the accumulation boundary, bucket by bucket (DeepSpeed's ``reduce_ipg_grads``
path with ``partition_gradients=False``).

The flat gradient buffer is cut into buckets of ``reduce_bucket_size`` elements. With the all-reduce
form (stage 0, ``reduce_scatter: false``, or gloo) a bucket is a contiguous range of the buffer; with the
reduce-scatter form it is the same column range of each rank's partition (the buffer viewed as
``world_size`` rows), so one ``reduce_scatter_tensor`` hands each rank its summed slice. With
``overlap_comm`` a bucket is launched from the post-accumulate-grad hook of the last parameter
touching it, on the boundary micro-step only, so communication overlaps the rest of backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class FlatGradientReducer:
    def __init__(self, flat_grads, param_groups, partition_sizes, bucket_numel: int, world_size: int, my_part: int,
                 all_reduce: bool, overlap_comm: bool, group=None, deliver=None):
        """``deliver(group_index, offset, reduced)``: where this rank's reduced partition slice goes (ZeRO-Offload
        streams it to host memory); by default it stays in ``flat_grads``."""
        self.flat_grads = flat_grads
        self.partition_sizes = partition_sizes
        self.world_size = world_size
        self.my_part = my_part
        self.all_reduce = all_reduce
        self.overlap_comm = overlap_comm
        self.group = group
        self.deliver = deliver
        self.bucket_numel = max(1, int(bucket_numel))
        self.buckets = []  # (group index, start, end): flat range (all-reduce) or column range (reduce-scatter)
        self._bucket_of: dict[int, list[int]] = {}  # param id -> bucket indices it writes into
        self._pending_params: list[int] = []  # per bucket: params not yet accumulated this backward
        self._params_in: list[int] = []
        for gi, (params, psize) in enumerate(zip(param_groups, partition_sizes)):
            first = len(self.buckets)
            span = flat_grads[gi].numel() if all_reduce else psize
            step = self.bucket_numel if all_reduce else max(1, self.bucket_numel // world_size)
            for start in range(0, span, step):
                self.buckets.append((gi, start, min(start + step, span)))
            off = 0
            for p in params:
                idx = self._buckets_touched(off, p.numel(), psize, step, first)
                self._bucket_of[id(p)] = idx
                off += p.numel()
        self._params_in = [0] * len(self.buckets)
        for idx in self._bucket_of.values():
            for b in idx:
                self._params_in[b] += 1
        self._boundary = False
        self._launched: list = []
        self._ready: set[int] = set()

    def _buckets_touched(self, off: int, n: int, psize: int, step: int, first: int) -> list[int]:
        if n == 0:
            return []
        if self.all_reduce:
            return list(range(first + off // step, first + (off + n - 1) // step + 1))
        out = set()
        for r in range(off // psize, (off + n - 1) // psize + 1):
            lo, hi = max(off, r * psize) - r * psize, min(off + n, (r + 1) * psize) - r * psize
            out.update(range(first + lo // step, first + (hi - 1) // step + 1))
        return sorted(out)

    def begin(self, is_boundary: bool) -> None:
        self._boundary = is_boundary
        self._pending_params = list(self._params_in)
        self._launched = [None] * len(self.buckets)
        self._ready = set()

    def grad_ready(self, p: torch.nn.Parameter) -> None:
        if not self._boundary:
            return
        if id(p) in self._ready:
            raise RuntimeError("a parameter's gradient was accumulated twice in one backward pass after its bucket "
                               "was sent; set zero_optimization.overlap_comm to false for this model")
        self._ready.add(id(p))
        for b in self._bucket_of.get(id(p), ()):
            self._pending_params[b] -= 1
            if self._pending_params[b] == 0:
                self._launch(b, async_op=True)

    def _launch(self, b: int, async_op: bool) -> None:
        gi, start, end = self.buckets[b]
        flat = self.flat_grads[gi]
        if self.all_reduce:
            bucket = flat[start:end]
            bucket.div_(self.world_size)  # pre-divide: the sum over ranks is the mean, fp16 stays in range
            work = dist.all_reduce(bucket, group=self.group, async_op=async_op)
            self._launched[b] = (work, None)
            return
        rows = flat.view(self.world_size, self.partition_sizes[gi])
        send = rows[:, start:end].contiguous().view(-1)
        send.div_(self.world_size)
        recv = torch.empty(end - start, dtype=flat.dtype, device=flat.device)
        work = dist.reduce_scatter_tensor(recv, send, group=self.group, async_op=async_op)
        self._launched[b] = (work, recv)

    def finish(self) -> None:
        """At the boundary: send what is left (unused params, or no overlap), wait, and place the results."""
        if not self._launched:
            self.begin(True)
        for b in range(len(self.buckets)):
            if self._launched[b] is None:
                self._launch(b, async_op=self.overlap_comm)
        for b, (work, recv) in enumerate(self._launched):
            if work is not None:
                work.wait()
            gi, start, end = self.buckets[b]
            psize = self.partition_sizes[gi]
            if self.all_reduce:
                # My partition's slice of this bucket, in partition coordinates.
                lo, hi = max(start, self.my_part * psize), min(end, (self.my_part + 1) * psize)
                if self.deliver is not None and hi > lo:
                    self.deliver(gi, lo - self.my_part * psize, self.flat_grads[gi][lo:hi])
                continue
            if self.deliver is not None:
                self.deliver(gi, start, recv)
            else:
                self.flat_grads[gi].view(self.world_size, psize)[self.my_part, start:end].copy_(recv)
        self._launched = []
