"""The sharding rules of the core, one file per family (torch's ``tensor/_ops/``): importing this registers them.
The rest of torch's op table (views, tensor ops, random fills, more reductions) is registered by
``pt_dist/_compat/tensor/``, which ``pt_dist.tensor`` imports."""

from pt_dist.tensor._ops import _math_ops, _matrix_ops, _pointwise_ops  # noqa: F401
