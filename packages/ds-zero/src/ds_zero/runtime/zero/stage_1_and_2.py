"""ZeRO stages 1 and 2 (Rajbhandari et al., 2020, sections 5.1-5.2), DeepSpeed's ``DeepSpeedZeroOptimizer``.

Each param group's low-precision parameters are flattened into one padded buffer (the model's
params become views into it), split into ``world_size`` contiguous partitions. Rank r keeps an fp32
master copy of partition r and the optimizer states for it.

* Stage 1 (P_os): a full flat gradient buffer, reduced at the accumulation boundary in
  ``reduce_bucket_size`` buckets (:mod:`flat_reducer`); with ``overlap_comm`` each bucket goes out
  as soon as the last gradient in it is accumulated, while backward continues.
* Stage 2 (P_os+g): backward hooks push each gradient into a bucket that is reduced to the owning
  ranks (:mod:`reduce_scatter`), so a rank only ever holds its gradient partition.

After the step each rank writes its master partition into the flat buffer and the buffer is
all-gathered in ``allgather_bucket_size`` pieces. Stage 0 (plain data parallelism) is the same with
one "partition" covering everything. With ZeRO-Offload the reduced partition streams into host fp32
buffers (:mod:`offload`) and the step runs there.
"""

from __future__ import annotations

import torch

from ds_zero.runtime.zero.base_optimizer import ZeroOptimizerBase
from ds_zero.runtime.zero.flat_reducer import FlatGradientReducer
from ds_zero.runtime.zero.partition_parameters import all_gather_rows
from ds_zero.runtime.zero.reduce_scatter import GradientBucketReducer, prefer_all_reduce


class DeepSpeedZeroOptimizer(ZeroOptimizerBase):
    def __init__(self, init_optimizer, loss_scaler, clip_grad: float = 0.0, groups=None,
                 partition_grads: bool = False, partition_optimizer: bool = True,
                 reduce_bucket_size: int = 500_000_000, allgather_bucket_size: int = 500_000_000,
                 overlap_comm: bool = False, contiguous_gradients: bool = True, reduce_scatter: bool = True,
                 offload_optimizer=None, device=None, compute_dtype=None):
        super().__init__(init_optimizer, loss_scaler, clip_grad, groups, partitioned=partition_optimizer,
                         offload_optimizer=offload_optimizer, device=device)
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
        self.grad_partitions: list[torch.Tensor] = []  # stage 2 without offload: this rank's grads only
        self._hooks = []
        self._param_pieces = {}
        fallback_dtype = compute_dtype or torch.float32
        for gi, group in enumerate(init_optimizer.param_groups):
            # Frozen params stay ordinary (replicated) tensors; a group of only frozen params is kept empty,
            # so per-group hyper-parameters and schedules still line up (DeepSpeed accepts such groups).
            params = [p for p in group["params"] if p.requires_grad]
            numel = sum(p.numel() for p in params)
            padded = -(-numel // parts) * parts
            psize = padded // parts
            dtype = params[0].dtype if params else fallback_dtype
            flat = torch.zeros(padded, dtype=dtype, device=self.device)
            off, ranges = 0, []
            for p in params:
                n = p.numel()
                flat[off:off + n].copy_(p.data.reshape(-1))
                p.data = flat[off:off + n].view_as(p)
                if partition_grads:
                    self._param_pieces[p] = (gi, self._pieces(off, n, psize))
                lo, hi = max(off, my_part * psize), min(off + n, (my_part + 1) * psize)
                ranges.append((p, lo - my_part * psize, hi - my_part * psize))
                off += n
            self._norm_runs.append(self._set_norm_runs(ranges))
            self.bit16_groups.append(params)
            self.flat_groups.append(flat)
            self.partition_size.append(psize)
            self.master_partitions.append(self._new_master(flat[my_part * psize:(my_part + 1) * psize]))
            if not partition_grads:
                self.flat_grads.append(torch.zeros(padded, dtype=dtype, device=self.device))
            elif not self.offload:
                self.grad_partitions.append(torch.zeros(psize, dtype=dtype, device=self.device))
        self.my_part = my_part
        self.optimizer = self._wrap_optimizer(init_optimizer)
        if partition_grads:
            deliver = self._offload_piece if self.offload else None
            self.reducer = GradientBucketReducer(self.grad_partitions, self.reduce_bucket_size,
                                                 self.flat_groups[0].dtype, overlap_comm, self.dp_process_group,
                                                 deliver=deliver)
            for p in self._param_pieces:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        else:
            all_reduce = (not partition_optimizer or not reduce_scatter
                          or (self.world_size > 1 and prefer_all_reduce(self.dp_process_group)))
            self.flat_reducer = FlatGradientReducer(
                self.flat_grads, self.bit16_groups, self.partition_size, self.reduce_bucket_size, self.world_size,
                my_part, all_reduce, overlap_comm, self.dp_process_group,
                deliver=self._offload_copy if self.offload else None)
            if overlap_comm:
                for params in self.bit16_groups:
                    for p in params:
                        self._hooks.append(p.register_post_accumulate_grad_hook(self.flat_reducer.grad_ready))
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

    def _offload_piece(self, pidx: int, off: int, reduced: torch.Tensor) -> None:
        self.grad_offloader.submit(self.fp32_grads[pidx][off:off + reduced.numel()], reduced, accumulate=True)

    def _offload_copy(self, pidx: int, off: int, reduced: torch.Tensor) -> None:
        self.grad_offloader.submit(self.fp32_grads[pidx][off:off + reduced.numel()], reduced, accumulate=False)

    def backward_prologue(self, is_boundary: bool) -> None:
        if not self.partition_grads:
            self.flat_reducer.begin(is_boundary)

    def post_backward(self, is_boundary: bool) -> None:
        """Called by the engine once autograd is done with a micro-batch."""
        if self.partition_grads:
            self.reducer.finish()
        elif is_boundary:
            self.flat_reducer.finish()

    def reduced_grad_partitions(self) -> list[torch.Tensor]:
        if self.offload:
            return self.fp32_grads
        if self.partition_grads:
            return self.grad_partitions
        return [flat[self.my_part * ps:(self.my_part + 1) * ps] for flat, ps in zip(self.flat_grads,
                                                                                    self.partition_size)]

    def lowp_partitions(self) -> list[torch.Tensor]:
        return [flat[self.my_part * ps:(self.my_part + 1) * ps] for flat, ps in zip(self.flat_groups,
                                                                                    self.partition_size)]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.fp32_grads:
            g.zero_()
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

    def _after_write_back(self) -> None:
        if not self.partition_optimizer or self.world_size == 1:
            return
        for flat, psize in zip(self.flat_groups, self.partition_size):
            if psize:  # in place into the flat buffer, as DeepSpeed's all_gather_dp_groups
                rows = flat.view(self.world_size, psize)
                all_gather_rows(rows, rows[self.my_part], self.dp_process_group,
                                max(1, self.allgather_bucket_size // self.world_size))

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
        self.close()
