"""torch's deprecated ``torch/distributed/_tensor/placement_types.py`` path: ``pt_dist.tensor.placement_types``."""

from pt_dist.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["Partial", "Placement", "Replicate", "Shard"]
