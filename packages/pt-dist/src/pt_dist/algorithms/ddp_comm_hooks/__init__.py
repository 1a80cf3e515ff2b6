"""DDP communication hooks at torch's module paths (torch.distributed.algorithms.ddp_comm_hooks)."""

from pt_dist.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

__all__ = ["default_hooks", "powerSGD_hook"]
