"""``torch.distributed.tensor.experimental``: ``implicit_replication``, ``local_map``
(``pt_dist/_compat/tensor/experimental.py``)."""

from pt_dist._compat.tensor.experimental import implicit_replication, local_map, register_sharding

__all__ = ["implicit_replication", "local_map", "register_sharding"]  # torch's, less context_parallel
