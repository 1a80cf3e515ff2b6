"""The ``"shm"`` backend: collectives through one shared-memory segment, for ranks on one host
(``process_group_shm.py``, then ``counters.py``; its shared-memory tricks live in ``_infra/``)."""

from pt_dist.backends.shm.process_group_shm import ProcessGroupSHM

__all__ = ["ProcessGroupSHM"]
