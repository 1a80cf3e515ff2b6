"""``parallelize_module`` (torch's ``torch/distributed/tensor/parallel/api.py``): a plan, one ``ParallelStyle`` or
a dict from module paths (``fnmatch`` patterns per dot-separated part, as torch's) to styles, applied on a 1-D
mesh (a 2-D mesh's ``mesh["tp"]``)."""

from __future__ import annotations

import warnings
from fnmatch import fnmatch

from torch import nn

from pt_dist._compat.tensor.parallel.style import ParallelStyle
from pt_dist.device_mesh import DeviceMesh, _mesh_resources

__all__ = ["parallelize_module"]



def parallelize_module(module: nn.Module, device_mesh: DeviceMesh | None = None,
                       parallelize_plan: ParallelStyle | dict[str, ParallelStyle] | None = None, *,
                       src_data_rank: int | None = 0) -> nn.Module:
    """Apply ``parallelize_plan`` to ``module`` (and its submodules by path) on ``device_mesh`` (by default the
    ``with mesh:`` one); ``src_data_rank`` is the rank whose parameter values are scattered (None: each rank's
    own). Returns ``module``, parallelized in place."""
    device_mesh = device_mesh or _mesh_resources.get_current_mesh()
    if parallelize_plan is None:
        warnings.warn("No parallelize_plan is provided and auto-parallel is not supported at the moment, so this "
                      "parallelize_module call will do nothing.", stacklevel=2)
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"Expect Union[ParallelStyle, Dict[str, ParallelStyle]] for parallelize_plan, "
                        f"{type(parallelize_plan)} found!")
    for path, style in parallelize_plan.items():
        if path == "":
            parallelize_module(module, device_mesh, style, src_data_rank=src_data_rank)
            continue
        token, _, rest = path.partition(".")
        matched = [child for name, child in module.named_children() if fnmatch(name, token)]
        if not matched:
            warnings.warn(f"Parallelize plan key '{path}' could not be resolved: no submodule matching token "
                          f"'{token}' in module {module}, skipping this plan entry.", stacklevel=2)
            continue
        for child in matched:
            parallelize_module(child, device_mesh, {rest: style} if rest else style, src_data_rank=src_data_rank)
    return module
