"""What every ZeRO stage shares: the fp32 master partition, the wrapped torch optimizer, and the step.

ZeRO (Rajbhandari et al., 2020, section 5.1, P_os): each rank owns a 1/N slice of the fp32 master
weights and of the optimizer states. The step here is DeepSpeed's ``step`` in
``stage_1_and_2.py``/``stage3.py``: overflow check across ranks, global gradient norm over the
partitions (one all-reduce), unscale and clip in one multiply, update the partition, write it back
into the low-precision parameters (the subclass then gathers them).
"""

from __future__ import annotations

import abc
import math

import torch
import torch.distributed as dist

from ds_zero.runtime.fp16.loss_scaler import LossScaler, has_overflow


class ZeroOptimizerBase(abc.ABC):
    """Subclasses build ``self.master_partitions`` (fp32 leaf tensors, one per param group) and the grads."""

    def __init__(self, init_optimizer: torch.optim.Optimizer, loss_scaler: LossScaler, clip_grad: float,
                 dp_process_group=None, master_device: torch.device | None = None):
        self.dp_process_group = dp_process_group
        self.world_size = dist.get_world_size(dp_process_group)
        self.rank = dist.get_rank(dp_process_group)
        self.loss_scaler = loss_scaler
        self.clip_grad = float(clip_grad)
        self.master_device = master_device
        self.overflow = False
        self._global_grad_norm = None
        self.client_optimizer = init_optimizer
        # Real param groups (hyper-parameters) stay with the torch optimizer the user or config built;
        # its params are swapped for our fp32 master partitions, one per group.
        self.master_partitions: list[torch.Tensor] = []

    def _wrap_optimizer(self, init_optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        for group, master in zip(init_optimizer.param_groups, self.master_partitions):
            group["params"] = [master]
        init_optimizer.state.clear()
        return init_optimizer

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
        """This rank's slice of the summed-over-ranks gradients, one per param group (low precision)."""

    @abc.abstractmethod
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradient buffers this stage keeps."""

    @abc.abstractmethod
    def _update_params_from_master(self) -> None:
        """Copy the updated master partitions into the model's low-precision params (and gather them)."""

    def get_global_norm(self, grads: list[torch.Tensor]) -> float:
        sq = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else None)
        for g in grads:
            # fp32 accumulation without materialising an fp32 copy of the partition
            sq += torch.linalg.vector_norm(g, dtype=torch.float32).pow(2)
        dist.all_reduce(sq, group=self.dp_process_group)
        return math.sqrt(sq.item())

    def step(self) -> bool:
        """One optimizer step; returns False when fp16 overflow made it skip."""
        grads = self.reduced_grad_partitions()
        if self.loss_scaler.dynamic:
            self.overflow = has_overflow(grads, self.dp_process_group)
            if self.overflow:
                self.zero_grad()
                self.loss_scaler.update_scale(True)
                return False
        scale = self.loss_scaler.loss_scale
        norm = self.get_global_norm(grads) / scale
        self._global_grad_norm = norm
        combined = scale
        if self.clip_grad > 0:
            # DeepSpeed's unscale_and_clip_grads: one multiply by 1 / (scale * clip factor).
            clip = (norm + 1e-6) / self.clip_grad
            if clip > 1:
                combined = scale * clip
        for master, g in zip(self.master_partitions, grads):
            master.grad = g.to(device=master.device, dtype=torch.float32)
            if combined != 1.0:
                master.grad.mul_(1.0 / combined)
        self.optimizer.step()
        for master in self.master_partitions:
            master.grad = None
        self._update_params_from_master()
        self.zero_grad()
        self.loss_scaler.update_scale(False)
        return True

    def get_global_grad_norm(self) -> float | None:
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
            raise ValueError(f"checkpoint was saved with data-parallel world size {sd['world_size']}, "
                             f"this run has {self.world_size}; consolidate it with zero_to_fp32 instead")
        self.optimizer.load_state_dict(sd["optimizer_state_dict"])
        for master, saved in zip(self.master_partitions, sd["master_partitions"]):
            if master.numel() != saved.numel():
                raise ValueError(f"checkpoint partition has {saved.numel()} elements, expected {master.numel()}")
            master.data.copy_(saved)
        self.loss_scaler.load_state_dict(sd["loss_scaler"])
        self._update_params_from_master()

    def optimizer_state_tensors(self) -> list[torch.Tensor]:
        out = []
        for st in self.optimizer.state.values():
            out.extend(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        return out
