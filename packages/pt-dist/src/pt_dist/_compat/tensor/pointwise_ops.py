"""The rest of torch's element-wise op list (``tensor/_ops/_pointwise_ops.py``): comparisons, rounding, clamps,
masks, logical and bitwise ops, more activations, each under the core's pointwise rule."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops._pointwise_ops import pointwise_rule
from pt_dist.tensor._ops.utils import register_prop_rule

aten = torch.ops.aten

_NAMES = """abs abs_ log1p expm1 sign sgn clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ maximum minimum
sin cos erf floor ceil round trunc frac eq ne gt lt ge le eq_ ne_ gt_ lt_ ge_ le_ isnan isinf isfinite logical_not
logical_and logical_or masked_fill masked_fill_ nan_to_num nan_to_num_ square bitwise_and bitwise_or bitwise_not
hardtanh hardtanh_ leaky_relu leaky_relu_ softplus""".split()

register_prop_rule([getattr(aten, n) for n in _NAMES if hasattr(aten, n)])(pointwise_rule)
