"""``pt_dist.tensor``: DTensor over pt_dist groups (torch's ``torch/distributed/tensor/``). Read ``_api.py``
(DTensor, from_local / to_local, distribute_tensor), then ``_dispatch.py`` (one op: rule -> redistribute ->
local op -> wrap), ``_ops/`` (the rules), ``_redistribute.py`` (the collectives of a placement change). The
factories, ``distribute_module`` and the rest of torch's op table are in ``pt_dist/_compat/tensor/``."""

import pt_dist._compat.tensor  # noqa: F401  (the rest of torch's op table; its rules override the core's)
import pt_dist.tensor._ops  # noqa: F401  (registers the core's sharding rules)
from pt_dist._compat.tensor.distribute_module import distribute_module
from pt_dist._compat.tensor.factories import empty, full, linspace, logspace, ones, rand, randn, zeros
from pt_dist.device_mesh import DeviceMesh, init_device_mesh
from pt_dist.tensor._api import DTensor, distribute_tensor
from pt_dist.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "Partial", "Placement", "Replicate", "Shard", "distribute_module", "distribute_tensor", "empty",
           "full", "linspace", "logspace", "ones", "rand", "randn", "zeros"]
_ = (DeviceMesh, init_device_mesh)  # importable from here, as torch's (not in its __all__)
