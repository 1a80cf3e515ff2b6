"""torch's deprecated ``torch/distributed/_tensor/api.py`` path: ``pt_dist.tensor._api``."""

from pt_dist.tensor import distribute_module
from pt_dist.tensor._api import DTensor, distribute_tensor

__all__ = ["DTensor", "distribute_module", "distribute_tensor"]
