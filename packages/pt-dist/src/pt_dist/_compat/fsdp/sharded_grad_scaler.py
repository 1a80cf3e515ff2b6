"""``ShardedGradScaler`` (torch/distributed/fsdp/sharded_grad_scaler.py): ``torch.amp.GradScaler`` for gradients
that are shards: each rank unscales its own shards, then the ranks agree on whether any found an inf or NaN
(an all-reduce of ``found_inf``), so all skip or all take the step and the scale stays equal everywhere.
Half-precision gradients are unscaled too (FSDP keeps them so under mixed precision)."""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(torch.amp.GradScaler):
    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, backoff_factor: float = 0.5,
                 growth_factor: float = 2.0, growth_interval: int = 2000, enabled: bool = True,
                 process_group=None) -> None:
        super().__init__(device, init_scale=init_scale, backoff_factor=backoff_factor, growth_factor=growth_factor,
                         growth_interval=growth_interval, enabled=enabled)
        if self._enabled:
            self.process_group = process_group  # None: the default group (torch's default, group.WORLD)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale this rank's gradient shards, then sum ``found_inf`` over the group (one rank's inf is all's)."""
        if not self._enabled:
            return
        super().unscale_(optimizer)
        works = [c10d.all_reduce(found_inf, group=self.process_group, async_op=True)
                 for found_inf in self._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values()]
        for work in works:
            work.wait()
