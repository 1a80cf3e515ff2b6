"""``pt_dist._tensor``: the deprecated path torch still serves (``torch/distributed/_tensor/``) for DTensor, which
lives at ``pt_dist.tensor``; ``pt_dist._tensor.device_mesh`` is ``pt_dist.device_mesh``."""

from pt_dist._tensor import api, device_mesh, placement_types  # noqa: F401
from pt_dist.tensor import (
    DeviceMesh,
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    empty,
    full,
    init_device_mesh,
    ones,
    zeros,
)

__all__ = ["DTensor", "DeviceMesh", "Partial", "Placement", "Replicate", "Shard", "distribute_module",
           "distribute_tensor", "empty", "full", "init_device_mesh", "ones", "zeros"]
