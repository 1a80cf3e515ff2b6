"""FSDP2: per-parameter sharding on a DTensor (torch's torch/distributed/fsdp/_fully_shard/)."""

from pt_dist._compat.fsdp.fsdp_forward_method import register_fsdp_forward_method
from pt_dist.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from pt_dist.fsdp._fully_shard._fully_shard import (
    FSDPModule,
    UnshardHandle,
    fully_shard,
)

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "UnshardHandle",
           "fully_shard", "register_fsdp_forward_method"]
