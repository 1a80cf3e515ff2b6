"""The ``"shm"`` backend: collectives through one shared-memory segment, for ranks on one host
(``process_group_shm.py``, then ``counters.py``, ``single_copy.py``, ``symmetric_memory.py``)."""

from pt_dist.backends.shm.process_group_shm import ProcessGroupSHM

__all__ = ["ProcessGroupSHM"]
