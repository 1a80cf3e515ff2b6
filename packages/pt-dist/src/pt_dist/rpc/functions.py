"""``torch.distributed.rpc.functions``: ``async_execution`` (pt_dist/_compat/rpc/functions.py)."""

from pt_dist._compat.rpc.functions import async_execution

__all__ = ["async_execution"]
