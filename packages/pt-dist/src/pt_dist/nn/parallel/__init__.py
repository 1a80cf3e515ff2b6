"""Data parallelism over pt_dist groups (torch.nn.parallel)."""

from pt_dist.nn.parallel.bucketing import GradBucket
from pt_dist.nn.parallel.distributed import DistributedDataParallel
from pt_dist.nn.parallel.reducer import Reducer

__all__ = ["DistributedDataParallel", "GradBucket", "Reducer"]
