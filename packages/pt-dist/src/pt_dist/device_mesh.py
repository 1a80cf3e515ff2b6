"""``DeviceMesh`` / ``init_device_mesh``: an n-d array of global ranks with one pt_dist group per mesh-dim slice,
as torch's ``torch/distributed/device_mesh.py``.

Every rank builds every slice's group (``new_group``, same order everywhere: mesh dim 0's slices first, then dim
1's, ...), keeping the one it is in; a slice that is the whole world in order reuses the default group, as
torch's does. ``mesh["dp"]`` cuts a sub-mesh out of the mesh by name and hands it the mesh's group for that
dimension: slicing creates no group and communicates nothing.
"""

from __future__ import annotations

import math
import threading

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.distributed_c10d import GroupMember
from pt_dist.subgroups import new_group

__all__ = ["DeviceMesh", "init_device_mesh"]


class _MeshEnv(threading.local):
    """The ``with mesh:`` stack (torch's ``_mesh_resources``), read when a DTensor API is called without a mesh."""

    def __init__(self) -> None:
        self.mesh_stack: list[DeviceMesh] = []

    def get_current_mesh(self) -> DeviceMesh:
        if not self.mesh_stack:
            raise RuntimeError("No device mesh is currently active!")
        return self.mesh_stack[-1]


_mesh_resources = _MeshEnv()


def _as_mesh_tensor(mesh) -> torch.Tensor:
    if isinstance(mesh, torch.Tensor):
        return mesh.detach().to("cpu", torch.int).contiguous()
    return torch.tensor(mesh, dtype=torch.int)


class DeviceMesh:
    """A mesh of global ranks (``mesh``: any int array; ``mesh_dim_names``: one unique name per dimension) over the
    initialised pt_dist world (torch's ``DeviceMesh``). Collective over all ranks of the world: call it
    everywhere, with the same mesh."""

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: tuple[str, ...] | None = None,
                 backend_override=None, _init_backend: bool = True, _rank: int | None = None,
                 _dim_groups: list | None = None, _strides: tuple[int, ...] | None = None) -> None:
        tensor = _as_mesh_tensor(mesh)
        names = tuple(mesh_dim_names) if mesh_dim_names else None
        flat = tensor.flatten().tolist()
        if tensor.ndim == 0:
            raise ValueError(f"DeviceMesh: mesh must have at least one dimension, got {mesh!r}")
        if names is not None and len(names) != tensor.ndim:
            raise RuntimeError(f"mesh_shape and mesh_dim_names should have same length! Found len(mesh_dim_names): "
                               f"{len(names)} and len(mesh_shape):{tensor.ndim}.")
        if names is not None and len(set(names)) != len(names):
            raise RuntimeError(f"Each mesh_dim_name must be unique. Found repeated mesh_dim_name in mesh_dim_names "
                               f"{names}")
        if backend_override is not None:
            raise NotImplementedError("DeviceMesh: backend_override is not supported by pt_dist (one backend per "
                                      f"world), got {backend_override!r}")
        if len(set(flat)) != len(flat):
            raise RuntimeError(f"DeviceMesh: mesh {tensor.tolist()} lists a rank more than once")
        self.device_type, self.mesh, self.mesh_dim_names = device_type, tensor, names
        self._strides = _strides if _strides is not None else tuple(tensor.stride())
        self._flatten_rank_map = tuple(flat)
        self._dim_groups = self._init_process_groups() if _init_backend else list(_dim_groups or [])
        self._root_mesh: DeviceMesh | None = None  # the mesh a sub-mesh was cut from
        self._rank = c10d.get_rank() if _rank is None else _rank
        hits = (tensor == self._rank).nonzero()
        self._coordinate_on_dim = tuple(hits[0].tolist()) if hits.size(0) else None

    def _init_process_groups(self) -> list:
        """One group per 1-d slice of every mesh dim, built on every rank in the same order (torch's
        ``_init_one_process_group``, its ``new_group`` branch), the world initialised first if it is not."""
        if not c10d.is_initialized():
            c10d.init_process_group()
        me, world = c10d.get_rank(), c10d.get_world_size()
        if self.mesh.numel() > world:
            raise RuntimeError(f"Mesh should not be bigger than default world size {world}, but found "
                               f"{self.mesh.numel()} ranks!")
        if any(not 0 <= r < world for r in self._flatten_rank_map):
            raise RuntimeError(f"DeviceMesh: mesh {self.mesh.tolist()} names ranks outside the world of size {world}")
        groups = []
        for dim in range(self.mesh.ndim):
            mine = None
            for ranks in self.mesh.swapdims(dim, -1).reshape(-1, self.mesh.size(dim)).tolist():
                if ranks == list(range(world)):
                    group = c10d.group.WORLD  # the whole world, in order: the default group, as torch's
                else:
                    name = self.mesh_dim_names[dim] if self.mesh_dim_names else f"dim_{dim}"
                    group = new_group(ranks=ranks, group_desc=f"mesh_{name}")
                if me in ranks:
                    mine = group
            groups.append(mine)
        return groups

    # -- what the mesh is ------------------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def size(self, mesh_dim: int | None = None) -> int:
        return self.mesh.numel() if mesh_dim is None else self.mesh.size(self._dim_index(mesh_dim))

    def get_rank(self) -> int:
        return c10d.get_rank()

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's index along every mesh dim; None when it is not in the mesh."""
        return self._coordinate_on_dim

    def _is_current_rank_part_of_mesh(self) -> bool:
        return self._coordinate_on_dim is not None

    # -- groups ----------------------------------------------------------------------------------------------------
    def _get_mesh_dim_by_name(self, mesh_dim_name: str) -> int:
        if not self.mesh_dim_names:
            raise KeyError("No `mesh_dim_names` found.")
        if mesh_dim_name not in self.mesh_dim_names:
            raise KeyError(f"Mesh dimension '{mesh_dim_name}' does not exist. Available mesh dimensions are: "
                           f"mesh_dim_names={self.mesh_dim_names}")
        return self.mesh_dim_names.index(mesh_dim_name)

    def _dim_index(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            return self._get_mesh_dim_by_name(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim={mesh_dim!r} is out of range for a {self.ndim}-d DeviceMesh")
        return mesh_dim % self.ndim

    def get_group(self, mesh_dim: int | str | None = None):
        """The pt_dist group of this rank's slice along ``mesh_dim`` (name or index; optional on a 1-d mesh)."""
        if mesh_dim is None and self.ndim > 1:
            raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions. Optional kwarg `mesh_dim` needs "
                               "to be specified when device_mesh.ndim > 1.")
        mesh_dim = 0 if mesh_dim is None else mesh_dim
        group = self._dim_groups[self._dim_index(mesh_dim)] if self._dim_groups else None
        if group is None or group is GroupMember.NON_GROUP_MEMBER:
            raise RuntimeError(f"rank {c10d.get_rank()} has no group on mesh dim {mesh_dim!r}: it is not in "
                               f"mesh {self.mesh.tolist()}")
        return group

    def get_all_groups(self) -> list:
        return [self.get_group(i) for i in range(self.ndim)]

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        return c10d.get_rank(self.get_group(mesh_dim))

    # -- slicing ---------------------------------------------------------------------------------------------------
    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh over the named dims (in the order given), through this rank: torch's ``mesh["dp"]``."""
        if not self.mesh_dim_names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if names == self.mesh_dim_names:
            return self
        dims = [self._get_mesh_dim_by_name(n) for n in names]
        if dims != sorted(set(dims)):  # torch's rule: a sub-mesh keeps the root's dim order
            raise KeyError(f"Invalid mesh_dim_names {names} specified. Mesh dim indices should be in ascending "
                           "order.")
        if self._coordinate_on_dim is None:
            raise RuntimeError(f"rank {self._rank} is not in mesh {self.mesh.tolist()}: no sub-mesh {names}")
        index = tuple(slice(None) if d in dims else self._coordinate_on_dim[d] for d in range(self.ndim))
        sub = DeviceMesh(self.device_type, self.mesh[index].contiguous(), mesh_dim_names=names, _init_backend=False,
                         _rank=self._rank, _dim_groups=[self._dim_groups[d] for d in dims],
                         _strides=tuple(self._strides[d] for d in dims))
        sub._root_mesh = self._root_mesh or self
        return sub

    def abort(self) -> None:
        """Abort this mesh's groups (torch's ``DeviceMesh.abort``): ranks waiting on a peer that died fail instead
        of hanging. A root mesh only (what a sub-mesh's abort would reach is ambiguous)."""
        if self._root_mesh is not None:
            raise RuntimeError("abort() is not supported on a submesh. Call abort() on the root mesh instead.")
        for group in dict.fromkeys(g for g in self._dim_groups if g is not None):
            group.abort()

    @staticmethod
    def from_group(group, device_type: str, mesh=None, *, mesh_dim_names: tuple[str, ...] | None = None
                   ) -> DeviceMesh:
        """A 1-d mesh over an existing pt_dist group (torch's ``DeviceMesh.from_group`` for one group)."""
        if isinstance(group, (list, tuple)) and len(group) != 1:
            raise NotImplementedError(f"DeviceMesh.from_group: pt_dist takes one group, got {len(group)}")
        group = group[0] if isinstance(group, (list, tuple)) else group
        ranks = c10d.get_process_group_ranks(group)
        if mesh is not None and _as_mesh_tensor(mesh).flatten().tolist() != ranks:
            raise ValueError(f"DeviceMesh.from_group: mesh {mesh!r} differs from the group's ranks {ranks}")
        return DeviceMesh(device_type, ranks, mesh_dim_names=mesh_dim_names, _init_backend=False,
                          _dim_groups=[group])

    # -- identity --------------------------------------------------------------------------------------------------
    def __enter__(self) -> DeviceMesh:
        _mesh_resources.mesh_stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _mesh_resources.mesh_stack.pop()

    def __repr__(self) -> str:
        sizes = (f"({', '.join(f'{k}={v}' for k, v in zip(self.mesh_dim_names, self.shape))})"
                 if self.mesh_dim_names else f"{self.shape}")
        return f"DeviceMesh({sizes}, '{self.device_type}', stride={self._strides})"

    def _hash_key(self) -> tuple:
        return self._flatten_rank_map, self.shape, self._strides, self.device_type, self.mesh_dim_names

    def __hash__(self) -> int:  # every DTensor op looks its mesh up: hashed once
        if self.__dict__.get("_hash") is None:
            self._hash = hash(self._hash_key())
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, DeviceMesh) and self._hash_key() == other._hash_key())

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_dim_groups"] = []  # groups are this process's connections: never pickled
        state["_hash"] = None
        return state


def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *,
                     mesh_dim_names: tuple[str, ...] | None = None, backend_override=None) -> DeviceMesh:
    """A mesh of shape ``mesh_shape`` over ranks ``0 .. prod(mesh_shape)-1`` in row-major order (torch's
    ``init_device_mesh``), initialising the pt_dist world first if it is not."""
    mesh_shape = tuple(mesh_shape)
    if not mesh_shape or any(not isinstance(s, int) or s < 1 for s in mesh_shape):
        raise ValueError(f"init_device_mesh: mesh_shape must be positive ints, got {mesh_shape!r}")
    if device_type and not device_type.isalpha():
        raise RuntimeError(f"Device type with index is not supported but got {device_type}. If you maintained a "
                           "'torch.device' object, it's recommended to pass in 'device.type'.")
    mesh = torch.arange(math.prod(mesh_shape), dtype=torch.int).view(mesh_shape)
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names, backend_override=backend_override)
