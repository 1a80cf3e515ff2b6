"""``torch.distributed.fsdp.sharded_grad_scaler``: ``ShardedGradScaler``
(``pt_dist/_compat/fsdp/sharded_grad_scaler.py``)."""

from pt_dist._compat.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ = ["ShardedGradScaler"]
