"""``torch.distributed.tensor.debug`` (torch's ``debug/_comm_mode.py``, ``_visualize_sharding.py``):
``CommDebugMode`` counts the collectives DTensor issues while it is active, under torch's keys (the functional
collectives' ops, ``c10d``'s for broadcast and scatter) and per module, forward and backward; and
``visualize_sharding``, which rank holds which block of a 1-D or 2-D DTensor.

pt_dist's DTensor calls its collectives from Python (``pt_dist/tensor/_collective_utils.py``), not as aten ops a
dispatch mode could see: while active, the mode stands in for that module's ``c10d`` and counts each call."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers the op keys torch's counts use)
from torch.utils.module_tracker import ModuleTracker

from pt_dist.tensor import _collective_utils
from pt_dist.tensor._api import DTensor
from pt_dist.tensor._utils import _local_shape_and_offset

__all__ = ["CommDebugMode", "visualize_sharding"]

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


class _ModuleInfo(ModuleTracker):
    """torch's ``ModuleTracker`` (the modules running, forward or backward) plus what torch's
    ``_CommModeModuleTracker`` records: the module a collective is charged to (``name``: set at a module's forward
    pre-hook, given back to its parent by a forward hook registered last, so its own output hooks, a tensor-parallel
    style's, still count as it), each module's parents, type, depth, parameters and their placements, children."""

    def __init__(self):
        super().__init__()
        self.module_helper_dict: dict[str, dict] = {}
        self.module_parameters_dict: dict[str, dict] = {}
        self.module_parents_dict: dict[str, set] = {}
        self.sharding_dict: dict[str, Any] = {}
        self.parent_dict: dict[str, list[str]] = {}
        self._handles: dict[str, Any] = {}

    def __enter__(self):
        for d in (self.module_helper_dict, self.module_parameters_dict, self.sharding_dict, self.parent_dict):
            d.clear()
        self.module_helper_dict["Global"], self.module_parents_dict = {"depth": 0}, {"Global": set()}
        self.name, self.parent_list = "Global", ["Global"]
        self._bw_handle = torch.nn.modules.module.register_module_full_backward_pre_hook(self._bw_hook)
        return super().__enter__()

    def __exit__(self, *args):
        super().__exit__(*args)
        self._bw_handle.remove()
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    def _fw_pre_hook(self, mod, input):
        super()._fw_pre_hook(mod, input)
        if self.is_bw:  # (an activation checkpoint re-running forward)
            return
        self.name = name = self._get_mod_name(mod)
        info = self.module_helper_dict.setdefault(name, {})
        info.update(module_type=str(type(mod)).replace("<", "").replace(">", ""), depth=len(self.parents) - 1)
        for pname, param in mod.named_parameters(recurse=False):
            self.module_parameters_dict.setdefault(name, {})[pname] = param.data
            if isinstance(param.data, DTensor):
                self.sharding_dict[f"{name}.{pname}"] = param.data.placements
                info.setdefault("parameters", {})[pname] = str(param.data.placements)
        self.module_parents_dict.setdefault(name, set(self.parents))
        self.parent_dict.setdefault(self.parent_list[-1], []).append(name)
        self.parent_list.append(name)
        if name in self._handles:
            self._handles[name].remove()
        self._handles[name] = mod.register_forward_hook(self._fw_set_module_hook)

    def _fw_set_module_hook(self, mod, input, output):
        if not self.is_bw:
            self.parent_list.pop()
            self.name = self.parent_list[-1]

    def _bw_hook(self, mod, grad_output):
        self.name = self._get_mod_name(mod)


class CommDebugMode:
    """Count DTensor's collectives inside ``with CommDebugMode() as mode:`` (``get_comm_counts``,
    ``get_total_counts``), per module forward and backward (``comm_module_counts``, the tracing table, the JSON
    dump), with each module's DTensor parameters (``get_parameter_info``, ``get_sharding_info``)."""

    def __init__(self):
        self.comm_counts: dict[Any, int] = defaultdict(int)
        self.comm_module_counts: dict[str, dict[str, dict[Any, int]]] = {}
        self.comm_registry = set(_KEYS.values())
        self.advanced_module_tracker = _ModuleInfo()
        self._outer = []

    def _count(self, key) -> None:
        """One collective: charged to the current module and each of its parents (torch's ``__torch_dispatch__``)."""
        self.comm_counts[key] += 1
        tracker = self.advanced_module_tracker
        phase = "backward" if tracker.is_bw else "forward"
        for fqn in {tracker.name, *tracker.module_parents_dict.get(tracker.name, ())}:
            counts = self.comm_module_counts.setdefault(fqn, {"forward": defaultdict(int),
                                                              "backward": defaultdict(int)})
            counts[phase][key] += 1

    def get_total_counts(self) -> int:
        return sum(self.comm_counts.values())

    def get_comm_counts(self) -> dict[Any, int]:
        return self.comm_counts

    def get_parameter_info(self) -> dict[str, dict[str, Any]]:
        return self.advanced_module_tracker.module_parameters_dict

    def get_sharding_info(self) -> dict[str, dict[str, Any]]:
        return self.advanced_module_tracker.sharding_dict

    def _modules(self) -> list[str]:
        return list(self.advanced_module_tracker.module_helper_dict)

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """Per module (indented by depth), with ``noise_level`` >= 1 its type and DTensor parameters, then its
        collectives' counts in forward and backward (the aten operations torch also lists at ``noise_level`` >= 1
        are not traced here)."""
        helper, table = self.advanced_module_tracker.module_helper_dict, ""
        for fqn in self._modules():
            info = helper.get(fqn, {"depth": 0})
            indent = "  " * (2 * info["depth"])
            table += f"{indent}{fqn}\n"
            if noise_level > 0 and "module_type" in info:
                table += f"{indent}*module type: {info['module_type']}\n"
                if "parameters" in info:
                    table += f"{indent}*Parameter List\n"
                    for pname, placement in info["parameters"].items():
                        table += f"{indent} *{pname}: {placement}\n"
            counts = self.comm_module_counts.get(fqn, {})
            for phase in ("forward", "backward"):
                if counts.get(phase):
                    table += f"{indent}  {phase.upper()} PASS\n"
                    for op, n in counts[phase].items():
                        table += f"{indent}    *{op}: {n}\n"
        return table

    def generate_json_dump(self, file_name: str = "comm_mode_log.json", noise_level: int = 3) -> None:
        """The module tree as torch's JSON for its browser view: each module's ``fqn``, ``module_type`` and
        ``parameters`` (``noise_level`` >= 1), ``collectives_forward`` / ``collectives_backward``, ``children``
        (``operations_*`` empty: operations are not traced here)."""
        tracker = self.advanced_module_tracker

        def node(fqn: str) -> dict:
            info = tracker.module_helper_dict.get(fqn, {})
            counts = self.comm_module_counts.get(fqn, {})
            return {"fqn": fqn, "module_type": info.get("module_type", "") if noise_level > 0 else "",
                    "parameters": list(info.get("parameters", {}).items()) if noise_level > 0 else [],
                    "children": [node(c) for c in tracker.parent_dict.get(fqn, []) if c != fqn],
                    "collectives_forward": [(str(k), n) for k, n in counts.get("forward", {}).items()],
                    "collectives_backward": [(str(k), n) for k, n in counts.get("backward", {}).items()],
                    "operations_forward": [], "operations_backward": [], "operations_checkpointing": []}

        with open(file_name, "w") as f:
            json.dump(node("Global"), f, indent=4)

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt", noise_level: int = 3
                                             ) -> None:
        with open(file_name, "w") as f:
            f.write(self.generate_comm_debug_tracing_table(noise_level))

    def __enter__(self) -> CommDebugMode:
        self.comm_counts.clear()
        self.comm_module_counts.clear()
        self.comm_module_counts["Global"] = {"forward": defaultdict(int), "backward": defaultdict(int)}
        self.advanced_module_tracker.__enter__()
        self._outer.append(_collective_utils.c10d)
        _collective_utils.c10d = _CountingC10d(self, _collective_utils.c10d)
        return self

    def __exit__(self, *exc) -> None:
        _collective_utils.c10d = self._outer.pop()
        self.advanced_module_tracker.__exit__(*exc)

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
