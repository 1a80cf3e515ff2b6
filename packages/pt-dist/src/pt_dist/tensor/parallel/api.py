"""torch's ``torch/distributed/tensor/parallel/api.py`` path (``pt_dist/_compat/tensor/parallel/api.py``)."""

from pt_dist._compat.tensor.parallel.api import parallelize_module

__all__ = ["parallelize_module"]
