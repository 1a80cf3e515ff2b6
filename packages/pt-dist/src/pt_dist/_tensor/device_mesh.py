"""torch's deprecated ``torch/distributed/_tensor/device_mesh.py`` path: ``pt_dist.device_mesh``."""

from pt_dist.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["DeviceMesh", "init_device_mesh"]
