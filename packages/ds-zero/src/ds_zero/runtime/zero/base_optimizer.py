"""What every ZeRO stage shares: the fp32 master partition, the wrapped torch optimizer, and the step.

ZeRO (Rajbhandari et al., 2020, section 5.1, P_os): each rank owns a 1/N slice of the fp32 master
weights and of the optimizer states. The step here is DeepSpeed's ``step`` in
``stage_1_and_2.py``/``stage3.py``: overflow check across ranks, global gradient norm over the
partitions, unscale and clip in one multiply, update the partition, write it back into the
low-precision parameters (the subclass then gathers them). With ZeRO-Offload the masters, their
fp32 gradients and the optimizer states are host tensors and the update is ``DeepSpeedCPUAdam``'s,
which writes the low-precision copy in the same pass.
"""

from __future__ import annotations

import abc
import logging
import math

import torch
import torch.distributed as dist

from ds_zero.ops.adam.cpu_adam import DeepSpeedCPUAdam
from ds_zero.runtime.fp16.loss_scaler import LossScaler, has_overflow
from ds_zero.runtime.zero.offload import GradientOffloader, HostMemory
from ds_zero.utils.groups import ParallelGroups, counts_in_norm

logger = logging.getLogger(__name__)


class ZeroOptimizerBase(abc.ABC):
    """Subclasses build ``self.master_partitions`` (fp32, one per param group) and the gradient buffers.

    ``partitioned``: whether the gradient partitions differ across data-parallel ranks (stages 1-3) and
    so must be summed for the norm; at stage 0 every rank holds the same full gradients.
    """

    def __init__(
        self,
        init_optimizer: torch.optim.Optimizer,
        loss_scaler: LossScaler,
        clip_grad: float,
        groups: ParallelGroups | None = None,
        partitioned: bool = True,
        offload_optimizer=None,
        device: torch.device | None = None,
    ):
        groups = groups or ParallelGroups()
        self.groups = groups
        self.dp_process_group = groups.dp_group
        self.world_size = groups.dp_world_size
        self.rank = groups.dp_rank
        self.mp_group = groups.mp_group if groups.mp_world_size > 1 else None
        self.partitioned = partitioned
        self.loss_scaler = loss_scaler
        self.clip_grad = float(clip_grad)
        self.overflow = False
        self._norm = 0.0  # DeepSpeed's optimizers start at 0.0
        self._pending_norm = None
        self.client_optimizer = init_optimizer
        self.device = device or torch.device("cpu")
        # nccl reduces only CUDA tensors; the host-side norms of ZeRO-Offload travel through this device.
        self.comm_device = self.device
        self.offload = offload_optimizer is not None and offload_optimizer.enabled
        self.host = HostMemory(offload_optimizer.pin_memory if self.offload else False)
        self.grad_offloader = GradientOffloader(self.device) if self.offload else None
        # Real param groups (hyper-parameters) stay with the torch optimizer the user or config built;
        # its params are swapped for our fp32 master partitions, one per group.
        self.master_partitions: list[torch.Tensor] = []
        self.fp32_grads: list[torch.Tensor] = []  # offload: the host fp32 gradient partitions
        self._norm_runs: list[list[tuple[int, int]] | None] = []  # per group: ranges entering the norm

    def _new_master(self, lowp: torch.Tensor) -> torch.Tensor:
        """This rank's fp32 master copy of a low-precision partition (host memory under offload)."""
        if self.offload:
            master = self.host.zeros(lowp.numel(), torch.float32, "optimizer_states")
            master.copy_(lowp)
            self.fp32_grads.append(self.host.zeros(lowp.numel(), torch.float32, "gradients"))
            return master
        return lowp.detach().to(torch.float32).clone()

    def _wrap_optimizer(self, init_optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        for i, group in enumerate(init_optimizer.param_groups):
            # No resident masters (ZeRO-Infinity keeps them on NVMe): the group keeps only its hyper-parameters.
            group["params"] = [self.master_partitions[i]] if i < len(self.master_partitions) else []
        init_optimizer.state.clear()
        if self.offload and hasattr(init_optimizer, "init_state"):
            for master in self.master_partitions:
                # Moments allocated now, in host memory, so they are counted (and pinned) from the start.
                state = init_optimizer.init_state(master)
                for key in ("exp_avg", "exp_avg_sq"):
                    state[key] = self.host.adopt(state[key], "optimizer_states")
        return init_optimizer

    def _set_norm_runs(self, params_with_ranges) -> list[tuple[int, int]] | None:
        """``params_with_ranges``: ``(param, lo, hi)`` of this rank's partition; keep the ranges that count."""
        runs, all_count = [], True
        for p, lo, hi in params_with_ranges:
            if hi <= lo:
                continue
            if counts_in_norm(p, self.groups.mp_rank):
                if runs and runs[-1][1] == lo:
                    runs[-1] = (runs[-1][0], hi)
                else:
                    runs.append((lo, hi))
            else:
                all_count = False
        return None if all_count else runs

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def cur_scale(self) -> float:
        return self.loss_scaler.cur_scale

    @abc.abstractmethod
    def reduced_grad_partitions(self) -> list[torch.Tensor]:
        """This rank's slice of the summed-over-ranks gradients, one per param group."""

    @abc.abstractmethod
    def lowp_partitions(self) -> list[torch.Tensor]:
        """This rank's slice of the low-precision params, one per group (what the masters are written into)."""

    @abc.abstractmethod
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradient buffers this stage keeps."""

    @abc.abstractmethod
    def _after_write_back(self) -> None:
        """The low-precision partitions were updated: make full params available again (gather)."""

    def _update_params_from_master(self) -> None:
        for lowp, master in zip(self.lowp_partitions(), self.master_partitions):
            lowp.copy_(master, non_blocking=True)
        self._after_write_back()

    def _reduce_groups(self) -> list:
        groups = [self.dp_process_group] if self.partitioned and self.world_size > 1 else []
        return groups + ([self.mp_group] if self.mp_group is not None else [])

    def _local_norm_sq(self, grads: list[torch.Tensor]) -> torch.Tensor:
        sq = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else self.device)
        for g, runs in zip(grads, self._norm_runs):
            # fp32 accumulation without materialising an fp32 copy of the partition
            for lo, hi in [(0, g.numel())] if runs is None else runs:
                if hi > lo:
                    sq += torch.linalg.vector_norm(g[lo:hi], dtype=torch.float32).pow(2)
        return sq.to(self.comm_device)

    def get_global_norm(self, grads: list[torch.Tensor]) -> float:
        sq = self._local_norm_sq(grads)
        for group in self._reduce_groups():
            dist.all_reduce(sq, group=group)
        return math.sqrt(sq.item())

    def _start_global_norm(self, grads: list[torch.Tensor], scale: float) -> None:
        """Without clipping the norm is only reported: its last all-reduce runs while the update goes on, and the
        end of ``step`` waits for it (every rank issues it at the same point)."""
        sq = self._local_norm_sq(grads)
        groups = self._reduce_groups()
        for group in groups[:-1]:
            dist.all_reduce(sq, group=group)
        work = dist.all_reduce(sq, group=groups[-1], async_op=True) if groups else None
        self._pending_norm = (sq, work, scale)

    def step(self) -> bool:
        """One optimizer step; returns False when fp16 overflow made it skip."""
        if self.grad_offloader is not None:
            self.grad_offloader.synchronize()
        grads = self.reduced_grad_partitions()
        if self.loss_scaler.dynamic:
            self.overflow = has_overflow(grads, self._reduce_groups(), self.comm_device)
            if self.overflow:
                self._norm, self._pending_norm = float("inf"), None  # DeepSpeed's norm of a skipped step
                self.zero_grad()
                self.loss_scaler.update_scale(True)
                return False
        scale = self.loss_scaler.loss_scale
        combined = scale
        if self.clip_grad > 0:
            norm = self.get_global_norm(grads) / scale
            self._set_norm(norm)
            # DeepSpeed's unscale_and_clip_grads: one multiply by 1 / (scale * clip factor).
            clip = (norm + 1e-6) / self.clip_grad
            if clip > 1:
                combined = scale * clip
        else:
            self._start_global_norm(grads, scale)
        if self.offload:
            # the host fp32 gradients are the masters' gradients: unscale and clip them in place
            for g in grads:
                if combined != 1.0:
                    g.mul_(1.0 / combined)
            for master, g in zip(self.master_partitions, grads):
                master.grad = g
        else:
            for master, g in zip(self.master_partitions, grads):
                master.grad = g.to(dtype=torch.float32)
                if combined != 1.0:
                    master.grad.mul_(1.0 / combined)
        self._run_optimizer()
        for master in self.master_partitions:
            master.grad = None
        self._after_write_back()
        self.zero_grad()
        self.loss_scaler.update_scale(False)
        # The norm's all-reduce ran under the update; it finishes before step returns, so no collective is ever
        # left in flight: one left pending when a script ended made gloo abort the rank whose peer exited first
        # ("terminate called without an active exception", issue 36).
        _ = self._global_grad_norm
        return True

    def _run_optimizer(self) -> None:
        """Update the masters and write them into the low-precision partitions."""
        lowp = self.lowp_partitions()
        fused = (
            self.offload and isinstance(self.optimizer, DeepSpeedCPUAdam) and all(t.device.type == "cpu" for t in lowp)
        )
        if fused:
            # CPUAdam rounds straight into the (host-resident) low-precision params: one pass, no extra copy.
            self.optimizer.step(fp16_param_groups=lowp)
            return
        self.optimizer.step()
        for t, master in zip(lowp, self.master_partitions):
            t.copy_(master, non_blocking=True)

    def _set_norm(self, norm: float) -> None:
        # DeepSpeed's types: a 0-dim fp32 tensor from the ZeRO optimizers (stages 1-3), a float at stage 0
        self._norm = torch.tensor(norm, dtype=torch.float32) if self.partitioned else norm
        self._pending_norm = None

    @property
    def _global_grad_norm(self):
        """The last step's gradient norm (unscaled), the attribute DeepSpeed's optimizers keep."""
        if self._pending_norm is not None:
            sq, work, scale = self._pending_norm
            if work is not None:
                work.wait()
            self._set_norm(math.sqrt(sq.item()) / scale)
        return self._norm

    def get_global_grad_norm(self):
        return self._global_grad_norm

    def state_dict(self) -> dict:
        return {
            "optimizer_state_dict": self.optimizer.state_dict(),
            "master_partitions": [m.detach().clone() for m in self.master_partitions],
            "loss_scaler": self.loss_scaler.state_dict(),
            "world_size": self.world_size,
            "rank": self.rank,
        }

    def load_state_dict(self, sd: dict) -> None:
        if sd["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint was saved with data-parallel world size {sd['world_size']}, "
                f"this run has {self.world_size}; consolidate it with zero_to_fp32 instead"
            )
        self._load_masters(sd["master_partitions"])
        self._load_optimizer_state(sd["optimizer_state_dict"])
        self.loss_scaler.load_state_dict(sd["loss_scaler"])
        self._update_params_from_master()

    def _load_masters(self, saved: list[torch.Tensor]) -> None:
        for master, s in zip(self.master_partitions, saved):
            if master.numel() != s.numel():
                raise ValueError(f"checkpoint partition has {s.numel()} elements, expected {master.numel()}")
            master.data.copy_(s)

    def _load_optimizer_state(self, sd: dict) -> None:
        # torch's load_state_dict replaces state tensors with new ones; copy into ours so offloaded
        # moments stay in (pinned) host memory.
        before = {id(p): dict(self.optimizer.state.get(p, {})) for p in self.master_partitions}
        self.optimizer.load_state_dict(sd)
        for p in self.master_partitions:
            old, new = before[id(p)], self.optimizer.state.get(p, {})
            for k, v in new.items():
                if torch.is_tensor(v) and torch.is_tensor(old.get(k)) and old[k].shape == v.shape:
                    old[k].copy_(v)
                    new[k] = old[k]

    def optimizer_state_tensors(self) -> list[torch.Tensor]:
        out = []
        for st in self.optimizer.state.values():
            out.extend(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        return out

    def close(self) -> None:
        self.get_global_grad_norm()
        if self.grad_offloader is not None:
            self.grad_offloader.close()
