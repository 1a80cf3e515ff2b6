"""``torch.distributed.fsdp.sharded_grad_scaler``: ``ShardedGradScaler``
(``pt_dist/_compat/fsdp/sharded_grad_scaler.py``)."""

from torch.amp.grad_scaler import GradScaler, OptState

from pt_dist._compat.fsdp.sharded_grad_scaler import ShardedGradScaler
from pt_dist.process_group import ProcessGroup

__all__ = ["ShardedGradScaler"]
_ = (GradScaler, OptState, ProcessGroup)  # importable from here, as from torch's module
