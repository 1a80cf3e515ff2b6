"""The process grid of hybrid parallelism (DeepSpeed's ``deepspeed/runtime/pipe/topology.py``).

:class:`ProcessTopology` maps ranks to coordinates on named axes (row-major: the last axis varies fastest)
and lists the ranks each axis groups. :class:`PipelineParallelGrid` builds the process groups a rank
trains in: its pipeline (the stages of one replica), its data-parallel replicas, and the "slice" (every
rank of one replica: pipe x model), which is what the engine treats as model parallelism when it sums
norms and agrees on overflows.
"""

from __future__ import annotations

from collections import namedtuple
from itertools import product

import torch.distributed as dist


class ProcessTopology:
    def __init__(self, axes: list[str], dims: list[int]):
        if len(axes) != len(dims) or len(set(axes)) != len(axes):
            raise ValueError(f"axes {axes} and dims {dims} must be the same length, axes distinct")
        if any(int(d) < 1 for d in dims):
            raise ValueError(f"every dimension must be >= 1, got {dims}")
        self.axes = list(axes)
        self.dims = [int(d) for d in dims]
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        self.mapping = {}
        for rank, coord in enumerate(product(*[range(d) for d in self.dims])):
            self.mapping[self.ProcessCoord(*coord)] = rank

    def get_rank(self, **coord_kwargs) -> int:
        if len(coord_kwargs) != len(self.axes):
            raise ValueError(f"get_rank needs a coordinate on every axis {self.axes}, got {sorted(coord_kwargs)}")
        key = self.ProcessCoord(**coord_kwargs)
        if key not in self.mapping:
            raise ValueError(f"coordinate {key} is outside the topology {dict(zip(self.axes, self.dims))}")
        return self.mapping[key]

    def get_axis_names(self) -> list[str]:
        return list(self.axes)

    def get_rank_repr(self, rank: int, omit_axes=("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-"):
        """``'model_01'``-style names for checkpoint files (DeepSpeed omits the data and pipe axes by default)."""
        coord = self.get_coord(rank)
        return outer_sep.join(f"{ax}{inner_sep}{getattr(coord, ax):02d}" for ax in self.axes if ax not in omit_axes)

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else None

    def get_coord(self, rank: int):
        for coord, r in self.mapping.items():
            if r == rank:
                return coord
        raise ValueError(f"rank {rank} is not in the topology (world size {self.world_size()})")

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """One list per group along ``axis``: ranks whose coordinates agree everywhere else."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for ccoord in product(*[range(self.get_dim(a)) for a in others]):
            other = dict(zip(others, ccoord))
            lists.append([self.get_rank(**other, **{axis: i}) for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **filter_kwargs) -> list[int]:
        return sorted(r for c, r in self.mapping.items()
                      if all(getattr(c, k) == v for k, v in filter_kwargs.items()))

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self.filter_match(**{axis: idx})

    def world_size(self) -> int:
        return len(self.mapping)

    def __str__(self):
        return str(self.mapping)


def _prime_factors(n: int) -> list[int]:
    if n <= 0:
        raise ValueError(f"prime factors of {n}: need a positive integer")
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline x data parallelism: stage-major, so a stage's data-parallel replicas are adjacent ranks."""

    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """3D: pipe x data x model (model fastest: tensor-parallel peers are adjacent ranks, as Megatron puts them)."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


class PipelineParallelGrid:
    """Process groups of a topology; implements the ``mpu`` interface the engine reads."""

    def __init__(self, topology: ProcessTopology | None = None, process_group=None):
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if topology is None:
            topology = PipeDataParallelTopology(num_pp=self.world_size, num_dp=1)
        if topology.world_size() != self.world_size:
            raise ValueError(f"topology has {topology.world_size()} ranks, torch.distributed has {self.world_size}")
        self._topo = topology
        self.data_parallel_size = max(topology.get_dim("data") or 1, 1)
        self.pipe_parallel_size = max(topology.get_dim("pipe") or 1, 1)
        self.model_parallel_size = max(topology.get_dim("model") or 1, 1)
        self.slice_parallel_size = self.pipe_parallel_size * self.model_parallel_size
        coord = topology.get_coord(self.global_rank)
        self.stage_id = getattr(coord, "pipe", 0)
        self.data_parallel_id = getattr(coord, "data", 0)
        self.model_parallel_id = getattr(coord, "model", 0)
        # Every rank creates every group in the same order (torch's new_group is collective).
        self.dp_group, self.dp_proc_group = self._groups_along("data")
        self.pp_group, self.pipe_proc_group = self._groups_along("pipe")
        self.mp_group, self.model_proc_group = self._groups_along("model")
        self.slice_group, self.slice_proc_group = None, None
        for d in range(self.data_parallel_size):
            ranks = topology.filter_match(data=d) if "data" in topology.axes else list(range(self.world_size))
            group = dist.new_group(ranks)
            if self.global_rank in ranks:
                self.slice_group, self.slice_proc_group = ranks, group
        # Each adjacent pair of stages (with equal data/model coordinates) talks point to point.
        self.p2p_groups = [[a, b] for lst in topology.get_axis_comm_lists("pipe") for a, b in zip(lst, lst[1:])]

    def _groups_along(self, axis: str):
        lists = self._topo.get_axis_comm_lists(axis) or [[r] for r in range(self.world_size)]
        mine = None
        for ranks in lists:
            group = dist.new_group(ranks)
            if self.global_rank in ranks:
                mine = (ranks, group)
        return mine

    def _is_grid_valid(self) -> bool:
        return self.data_parallel_size * self.pipe_parallel_size * self.model_parallel_size == self.world_size

    def topology(self) -> ProcessTopology:
        return self._topo

    def get_stage_id(self) -> int:
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.pipe_parallel_size - 1

    def stage_to_global(self, stage_id: int, **kwargs) -> int:
        """The global rank of ``stage_id`` with this rank's other coordinates (overridable by keyword)."""
        coord = self._topo.get_coord(self.global_rank)._asdict()
        coord.update(kwargs)
        coord["pipe"] = stage_id
        return self._topo.get_rank(**coord)

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.pipe_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    # DeepSpeed's grid answers "model parallel" with the slice (pipe x model) group, and the tensor-parallel rank.
    def get_model_parallel_rank(self) -> int:
        return self.model_parallel_id

    def get_model_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_model_parallel_group(self):
        return self.slice_proc_group

    def get_slice_parallel_rank(self) -> int:
        return self.slice_group.index(self.global_rank)

    def get_slice_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_slice_parallel_group(self):
        return self.slice_proc_group

    def get_tensor_model_parallel_rank(self) -> int:
        return self.model_parallel_id

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_tensor_model_parallel_group(self):
        return self.model_proc_group
