"""``torch.distributed.optim`` rebuilt: ``DistributedOptimizer`` (optimizer.py)."""

from pt_dist.optim.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
