"""pt-dist's process-group backends: the registry (``registry.py``), the front end they share (``base.py``), the
tcp ring (``tcp.py``, ``ring.py``, ``peer_mesh.py``, ``p2p.py``) and the shared-memory backend (``shm/``)."""

from pt_dist.backends.registry import Backend, get_default_backend_for_device, is_backend_available

__all__ = ["Backend", "get_default_backend_for_device", "is_backend_available"]
