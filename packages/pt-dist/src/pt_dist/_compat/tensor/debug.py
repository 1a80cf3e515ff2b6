"""``torch.distributed.tensor.debug`` (torch's ``debug/_comm_mode.py``, ``_visualize_sharding.py``):
``CommDebugMode`` counts the collectives DTensor issues while it is active, under torch's keys (the functional
collectives' ops, ``c10d``'s for broadcast and scatter) and per module, forward and backward; and
``visualize_sharding``, which rank holds which block of a 1-D or 2-D DTensor.

pt_dist's DTensor calls its collectives from Python (``pt_dist/tensor/_collective_utils.py``), not as aten ops a
dispatch mode could see: while active, the mode stands in for that module's ``c10d`` and counts each call."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers the op keys torch's counts use)
from torch.utils.module_tracker import ModuleTracker

from pt_dist.tensor import _collective_utils
from pt_dist.tensor._utils import _local_shape_and_offset

__all__ = ["CommDebugMode", "visualize_sharding"]

logger = logging.getLogger(__name__)

# what each call of _collective_utils' counts as, under torch's CommDebugMode keys
_KEYS = {
    "all_gather_into_tensor": torch.ops.c10d_functional.all_gather_into_tensor,
    "all_reduce": torch.ops.c10d_functional.all_reduce,
    "reduce_scatter_tensor": torch.ops.c10d_functional.reduce_scatter_tensor,
    "all_to_all_single": torch.ops._dtensor.shard_dim_alltoall,
    "broadcast": torch.ops.c10d.broadcast_,
    "scatter": torch.ops.c10d.scatter_,
}


class _CountingC10d:
    """``pt_dist.distributed_c10d`` as ``_collective_utils`` sees it while a mode is active."""

    def __init__(self, mode: CommDebugMode, c10d):
        self._mode, self._c10d = mode, c10d

    def __getattr__(self, name: str):
        fn = getattr(self._c10d, name)
        if name not in _KEYS:
            return fn

        def counted(*args, **kwargs):
            self._mode._count(_KEYS[name])
            return fn(*args, **kwargs)

        return counted


class CommDebugMode:
    """Count DTensor's collectives inside ``with CommDebugMode() as mode:`` (``get_comm_counts``,
    ``get_total_counts``; per module: ``comm_module_counts``, ``generate_comm_debug_tracing_table``)."""

    def __init__(self):
        self.comm_counts: dict[Any, int] = defaultdict(int)
        self.comm_module_counts: dict[str, dict[str, dict[Any, int]]] = {}
        self.comm_registry = set(_KEYS.values())
        self._tracker = ModuleTracker()
        self._outer = []

    def _count(self, key) -> None:
        self.comm_counts[key] += 1
        phase = "backward" if self._tracker.is_bw else "forward"
        for fqn in sorted(self._tracker.parents):
            counts = self.comm_module_counts.setdefault(fqn, {"forward": defaultdict(int),
                                                              "backward": defaultdict(int)})
            counts[phase][key] += 1

    def get_total_counts(self) -> int:
        return sum(self.comm_counts.values())

    def get_comm_counts(self) -> dict[Any, int]:
        return self.comm_counts

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """Per module, its collectives' counts in forward and backward (the operations torch also lists at
        ``noise_level`` > 0 are not traced here)."""
        table = ""
        for fqn, counts in self.comm_module_counts.items():
            indent = "  " * (2 * (0 if fqn == "Global" else fqn.count(".") + 1))
            table += f"{indent}{fqn}\n"
            for phase in ("forward", "backward"):
                if counts[phase]:
                    table += f"{indent}  {phase.upper()} PASS\n"
                    for op, n in counts[phase].items():
                        table += f"{indent}    *{op}: {n}\n"
        return table

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt", noise_level: int = 3
                                             ) -> None:
        with open(file_name, "w") as f:
            f.write(self.generate_comm_debug_tracing_table(noise_level))

    def __enter__(self) -> CommDebugMode:
        self.comm_counts.clear()
        self.comm_module_counts.clear()
        self.comm_module_counts["Global"] = {"forward": defaultdict(int), "backward": defaultdict(int)}
        self._tracker.__enter__()
        self._outer.append(_collective_utils.c10d)
        _collective_utils.c10d = _CountingC10d(self, _collective_utils.c10d)
        return self

    def __exit__(self, *exc) -> None:
        _collective_utils.c10d = self._outer.pop()
        self._tracker.__exit__(*exc)

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts()={self.get_total_counts()})"


def visualize_sharding(dtensor, header: str = "", use_rich: bool = False) -> None:
    """Print (on the mesh's first rank) which ranks hold which rows and columns of a 1-D or 2-D DTensor, as torch's
    plain-text table: ``Row a-b`` / ``Col c-d`` headers, ``cpu:<ranks>`` in each block (``header`` and
    ``use_rich`` are taken and unused, as torch's without ``rich``)."""
    if dtensor.numel() == 0:
        return
    if dtensor.dim() >= 3:
        raise RuntimeError("visualize sharding supports only 1D or 2D DTensor")
    mesh = dtensor.device_mesh
    if mesh.get_coordinate() is None or any(c != 0 for c in mesh.get_coordinate()):
        return
    blocks = []
    ranks = mesh.mesh.reshape(-1).tolist()
    coords = [tuple(int(i) for i in c) for c in torch.cartesian_prod(
        *[torch.arange(n) for n in mesh.shape]).reshape(len(ranks), -1)]
    for rank, coord in zip(ranks, coords):
        local, offset = _local_shape_and_offset(dtensor.shape, mesh.shape, coord, dtensor.placements)
        local, offset = (local, offset) if dtensor.dim() == 2 else ((local[0], 1), (offset[0], 0))
        blocks.append(((offset[0], offset[0] + local[0] - 1), (offset[1], offset[1] + local[1] - 1), rank))
    print(_table(blocks, mesh.device_type))  # noqa: T201  (a picture for the terminal; torch prints it too)


def _table(blocks, device_kind: str) -> str:
    rows = sorted({b[0] for b in blocks})
    cols = sorted({b[1] for b in blocks})
    cells = [["" for _ in cols] for _ in rows]
    for r, c, rank in blocks:
        cell = cells[rows.index(r)][cols.index(c)]
        cells[rows.index(r)][cols.index(c)] = f"{device_kind}:{rank}" if not cell else f"{cell},{rank}"
    head = [""] + [f"Col {c[0]}-{c[1]}" for c in cols]
    body = [[f"Row {r[0]}-{r[1]}", *line] for r, line in zip(rows, cells)]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*head), rule, *(fmt.format(*line) for line in body)])
