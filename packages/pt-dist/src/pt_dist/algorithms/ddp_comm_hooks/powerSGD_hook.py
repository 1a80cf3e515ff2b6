"""torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook (``_compat/ddp_comm_hooks/powerSGD_hook.py``)."""

from pt_dist._compat.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

__all__ = ["PowerSGDState", "powerSGD_hook"]
