"""``torch.distributed.tensor.device_mesh``: the mesh, importable from here as from torch's module
(``pt_dist/device_mesh.py``)."""

from pt_dist.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["DeviceMesh", "init_device_mesh"]
