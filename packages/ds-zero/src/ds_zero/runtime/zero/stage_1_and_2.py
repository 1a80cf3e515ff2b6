"""ZeRO stages 1 and 2 (Rajbhandari et al., 2020, sections 5.1-5.2), DeepSpeed's ``DeepSpeedZeroOptimizer``.

Each param group's low-precision parameters are flattened into one padded buffer (the model's
params become views into it), split into ``world_size`` contiguous partitions. Rank r keeps an fp32
master copy of partition r and the optimizer states for it.

* Stage 1 (P_os): a full flat gradient buffer; at the accumulation boundary it is all-reduced in
  ``reduce_bucket_size`` buckets and each rank reads its partition.
* Stage 2 (P_os+g): backward hooks push each gradient into a bucket that is reduced to the owning
  ranks (:mod:`reduce_scatter`), so a rank only ever holds its gradient partition.

After the step each rank writes its master partition into the flat buffer and the buffer is
all-gathered in ``allgather_bucket_size`` pieces. Stage 0 (plain data parallelism) is the same with
one "partition" covering everything.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ds_zero.runtime.zero.base_optimizer import ZeroOptimizerBase
from ds_zero.runtime.zero.reduce_scatter import GradientBucketReducer, prefer_all_reduce


class DeepSpeedZeroOptimizer(ZeroOptimizerBase):
    def __init__(self, init_optimizer, loss_scaler, clip_grad: float = 0.0, dp_process_group=None,
                 partition_grads: bool = False, partition_optimizer: bool = True,
                 reduce_bucket_size: int = 500_000_000, allgather_bucket_size: int = 500_000_000,
                 overlap_comm: bool = False, contiguous_gradients: bool = True, reduce_scatter: bool = True,
                 master_device=None):
        super().__init__(init_optimizer, loss_scaler, clip_grad, dp_process_group, master_device)
        self.partition_grads = partition_grads
        self.partition_optimizer = partition_optimizer
        self.reduce_bucket_size = int(reduce_bucket_size)
        self.allgather_bucket_size = int(allgather_bucket_size)
        self.overlap_comm = overlap_comm
        self.reduce_scatter = reduce_scatter
        parts = self.world_size if partition_optimizer else 1
        my_part = self.rank if partition_optimizer else 0
        self.bit16_groups: list[list[torch.nn.Parameter]] = []
        self.flat_groups: list[torch.Tensor] = []  # padded low-precision flat params, per group
        self.partition_size: list[int] = []
        self.flat_grads: list[torch.Tensor] = []  # stage 0/1: full flat grads
        self.grad_partitions: list[torch.Tensor] = []  # stage 2: this rank's grads only
        self._hooks = []
        self._param_pieces = {}
        for gi, group in enumerate(init_optimizer.param_groups):
            params = [p for p in group["params"] if p.requires_grad]
            if not params:
                raise ValueError(f"param group {gi} has no trainable parameters")
            numel = sum(p.numel() for p in params)
            padded = -(-numel // parts) * parts
            psize = padded // parts
            dtype, device = params[0].dtype, params[0].device
            flat = torch.zeros(padded, dtype=dtype, device=device)
            off = 0
            for p in params:
                n = p.numel()
                flat[off:off + n].copy_(p.data.reshape(-1))
                p.data = flat[off:off + n].view_as(p)
                if partition_grads:
                    self._param_pieces[p] = (gi, self._pieces(off, n, psize))
                off += n
            master = flat[my_part * psize:(my_part + 1) * psize].detach().to(
                device=master_device or device, dtype=torch.float32).clone()
            self.bit16_groups.append(params)
            self.flat_groups.append(flat)
            self.partition_size.append(psize)
            self.master_partitions.append(master)
            if partition_grads:
                self.grad_partitions.append(torch.zeros(psize, dtype=dtype, device=device))
            else:
                self.flat_grads.append(torch.zeros(padded, dtype=dtype, device=device))
        self.my_part = my_part
        self.optimizer = self._wrap_optimizer(init_optimizer)
        if partition_grads:
            self.reducer = GradientBucketReducer(self.grad_partitions, self.reduce_bucket_size,
                                                 self.flat_groups[0].dtype, overlap_comm, dp_process_group)
            for p in self._param_pieces:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self.zero_grad()

    def _pieces(self, off: int, n: int, psize: int) -> list:
        """Which ranks own which slices of a param living at ``[off, off+n)`` of the flat buffer."""
        out = []
        for r in range(off // psize, (off + n - 1) // psize + 1):
            lo, hi = max(off, r * psize), min(off + n, (r + 1) * psize)
            out.append((r, lo - off, hi - off, lo - r * psize))
        return out

    def _grad_ready(self, p: torch.nn.Parameter) -> None:
        gi, pieces = self._param_pieces[p]
        self.reducer.add(p.grad, pieces, gi)
        p.grad = None  # ZeRO-2: the full gradient does not outlive its reduction

    def post_backward(self, is_boundary: bool) -> None:
        """Called by the engine once autograd is done with a micro-batch."""
        if self.partition_grads:
            self.reducer.finish()
        elif is_boundary:
            self._allreduce_flat_grads()

    def _allreduce_flat_grads(self) -> None:
        """Stage 0/1 at the boundary. Each rank only needs its own partition summed, so by default (DeepSpeed's
        ``reduce_scatter: true``) the flat buffer, laid out as N partitions back to back, is reduce-scattered
        column-bucket by column-bucket (half an all-reduce's volume); otherwise it is all-reduced in buckets."""
        works = []
        for flat, psize in zip(self.flat_grads, self.partition_size):
            flat.div_(self.world_size)
            if not self.partition_optimizer or not self.reduce_scatter or prefer_all_reduce(self.dp_process_group):
                for start in range(0, flat.numel(), self.reduce_bucket_size):
                    bucket = flat[start:start + self.reduce_bucket_size]
                    works.append((dist.all_reduce(bucket, group=self.dp_process_group, async_op=self.overlap_comm),
                                  None, None))
                continue
            rows = flat.view(self.world_size, psize)
            cols = max(1, self.reduce_bucket_size // self.world_size)
            for start in range(0, psize, cols):
                send = flat if cols >= psize else rows[:, start:start + cols].contiguous()
                recv = torch.empty(send.numel() // self.world_size, dtype=flat.dtype, device=flat.device)
                work = dist.reduce_scatter_tensor(recv, send.view(-1), group=self.dp_process_group,
                                                  async_op=self.overlap_comm)
                works.append((work, recv, rows[self.my_part, start:start + recv.numel()]))
        for work, recv, dst in works:
            if work is not None:
                work.wait()
            if recv is not None:
                dst.copy_(recv)

    def reduced_grad_partitions(self) -> list[torch.Tensor]:
        if self.partition_grads:
            return self.grad_partitions
        return [flat[self.my_part * ps:(self.my_part + 1) * ps] for flat, ps in zip(self.flat_grads,
                                                                                    self.partition_size)]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.partition_grads:
            for g in self.grad_partitions:
                g.zero_()
            for params in self.bit16_groups:
                for p in params:
                    p.grad = None
            return
        for flat, params in zip(self.flat_grads, self.bit16_groups):
            flat.zero_()
            off = 0
            for p in params:
                # Views into the flat buffer: autograd accumulates in place, so no copy at reduction time.
                p.grad = flat[off:off + p.numel()].view_as(p)
                off += p.numel()

    def _update_params_from_master(self) -> None:
        for flat, master, psize in zip(self.flat_groups, self.master_partitions, self.partition_size):
            mine = flat[self.my_part * psize:(self.my_part + 1) * psize]
            mine.copy_(master)
            if not self.partition_optimizer or self.world_size == 1:
                continue
            chunk = max(1, self.allgather_bucket_size // self.world_size)
            rows = flat.view(self.world_size, psize)
            for start in range(0, psize, chunk):
                send = mine[start:start + chunk].clone()
                recv = torch.empty(self.world_size * send.numel(), dtype=flat.dtype, device=flat.device)
                dist.all_gather_into_tensor(recv, send, group=self.dp_process_group)
                rows[:, start:start + send.numel()].copy_(recv.view(self.world_size, -1))

    def memory_tensors(self) -> dict:
        grads = self.grad_partitions if self.partition_grads else self.flat_grads
        return {"parameters": list(self.flat_groups), "gradients": list(grads),
                "optimizer_states": list(self.master_partitions) + self.optimizer_state_tensors()}

    def layout(self) -> dict:
        """Enough to rebuild full params from all ranks' master partitions (zero_to_fp32)."""
        return {"kind": "flat", "partition_count": self.world_size if self.partition_optimizer else 1,
                "partition_size": list(self.partition_size),
                "numels": [[p.numel() for p in ps] for ps in self.bit16_groups]}

    @property
    def trainable_param_groups(self) -> list[list[torch.nn.Parameter]]:
        return self.bit16_groups

    def destroy(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
