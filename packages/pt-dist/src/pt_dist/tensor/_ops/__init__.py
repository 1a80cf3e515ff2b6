"""The sharding rules, one file per family (torch's ``tensor/_ops/``); importing this registers them all."""

from pt_dist.tensor._ops import _math_ops, _matrix_ops, _pointwise_ops, _random_ops, _tensor_ops, _view_ops  # noqa: F401
