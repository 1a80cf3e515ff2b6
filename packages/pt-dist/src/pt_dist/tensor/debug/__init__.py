"""``torch.distributed.tensor.debug``: ``CommDebugMode``, ``visualize_sharding``
(``pt_dist/_compat/tensor/debug.py``)."""

from pt_dist._compat.tensor.debug import CommDebugMode, visualize_sharding

__all__ = ["CommDebugMode", "visualize_sharding"]
