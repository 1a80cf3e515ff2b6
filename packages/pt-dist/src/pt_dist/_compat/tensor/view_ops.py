"""Views (torch's ``tensor/_ops/_view_ops.py``): ``t``/``transpose``/``permute`` move shard dims; ``select``/
``slice`` of a sharded dim gather it; ``unsqueeze``/``squeeze``/``expand`` renumber them; ``view``/
``_unsafe_view`` (what ``reshape``, ``flatten`` and ``matmul`` reach) keep a shard when it is exact: the sharded
dim is the outermost of the dims it merges with or splits into, and both it and the output dim it becomes divide
evenly by the mesh dims sharding it, so every rank's local view is its chunk of the new dim (the local op gets the
local size). Otherwise that mesh dim is replicated first, as torch's propagation does (torch keeps some of those
as a ``_StridedShard``, which pt_dist does not have). Partial stays Partial through every view (they are linear)."""

from __future__ import annotations

import math

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor._utils import _local_shape_and_offset
from pt_dist.tensor.placement_types import Replicate, Shard

aten = torch.ops.aten


def _map_dims(call: OpCall, new_dim_of) -> OutputSharding:
    """Placements through a view whose input dim ``d`` becomes output dim ``new_dim_of(d)`` (None: replicate)."""
    ins, out = [], []
    for p in call.specs[0].placements:
        if isinstance(p, Shard):
            nd = new_dim_of(p.dim)
            ins.append(p if nd is not None else Replicate())
            out.append(Shard(nd) if nd is not None else Replicate())
        else:
            ins.append(p)
            out.append(p)
    return OutputSharding([tuple(ins)], tuple(out))


@register_prop_rule([aten.t])
def t_rule(call: OpCall) -> OutputSharding:
    ndim = call.specs[0].ndim
    return _map_dims(call, lambda d: d if ndim < 2 else 1 - d)


@register_prop_rule([aten.transpose])
def transpose_rule(call: OpCall) -> OutputSharding:
    ndim = max(call.specs[0].ndim, 1)
    a, b = call.arg(1, "dim0") % ndim, call.arg(2, "dim1") % ndim
    return _map_dims(call, lambda d: b if d == a else a if d == b else d)


@register_prop_rule([aten.permute])
def permute_rule(call: OpCall) -> OutputSharding:
    ndim = max(call.specs[0].ndim, 1)
    dims = [d % ndim for d in call.arg(1, "dims")]
    return _map_dims(call, lambda d: dims.index(d))


@register_prop_rule([aten.unsqueeze])
def unsqueeze_rule(call: OpCall) -> OutputSharding:
    dim = call.arg(1, "dim") % (call.specs[0].ndim + 1)
    return _map_dims(call, lambda d: d + 1 if d >= dim else d)


@register_prop_rule([aten.squeeze])
def squeeze_rule(call: OpCall) -> OutputSharding:
    shape = call.specs[0].shape
    ndim = max(len(shape), 1)
    dims = call.arg(1, "dim")
    dims = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    gone = {d % ndim for d in dims if shape[d % ndim] == 1}
    return _map_dims(call, lambda d: None if d in gone else d - sum(g < d for g in gone))


@register_prop_rule([aten.expand])
def expand_rule(call: OpCall) -> OutputSharding:
    shape, size = call.specs[0].shape, list(call.arg(1, "size"))
    lead = len(size) - len(shape)
    out = _map_dims(call, lambda d: d + lead if size[d + lead] in (-1, shape[d]) else None)
    return _with_local_size(call, out, [shape[i - lead] if s == -1 else s for i, s in enumerate(size)])


def _with_local_size(call: OpCall, out: OutputSharding, global_size: list[int]) -> OutputSharding:
    """The same sharding, the local op given this rank's size instead of the global one (argument 1)."""
    size = list(_local_shape_and_offset(global_size, call.mesh.shape, call.mesh.get_coordinate(),
                                        out.output_placements, skip_offset=True)[0])
    args = list(call.args)
    if len(args) > 1:
        args[1] = size
        out.local_args, out.local_kwargs = tuple(args), call.kwargs
    else:
        out.local_args, out.local_kwargs = tuple(args), {**call.kwargs, "size": size}
    return out


def _groups(src: list[int], dst: list[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of input and output dims whose sizes multiply to the same number ([4, 6] -> [24]: one group)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(src):
            gi.append(i)
            pi, i = pi * src[i], i + 1
        if j < len(dst):
            gj.append(j)
            pj, j = pj * dst[j], j + 1
        while pi != pj and (i < len(src) or j < len(dst)):
            if (pi < pj and i < len(src)) or j >= len(dst):
                gi.append(i)
                pi, i = pi * src[i], i + 1
            else:
                gj.append(j)
                pj, j = pj * dst[j], j + 1
        groups.append((gi, gj))
    return groups


@register_prop_rule([aten.view, aten._unsafe_view, aten.reshape])
def view_rule(call: OpCall) -> OutputSharding:
    spec = call.specs[0]
    src = list(spec.shape)
    size = list(call.arg(1, "size"))
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = math.prod(src) // known if known else 0
    groups = _groups(src, size)

    def new_dim_of(d: int):
        ways = math.prod(call.mesh.size(i) for i, q in enumerate(spec.placements) if q.is_shard(d))
        for gi, gj in groups:
            if d in gi:
                ins = [i for i in gi if src[i] != 1]
                outs = [j for j in gj if size[j] != 1]
                if not ins or not outs or ins[0] != d:
                    return None
                if len(ins) == 1 and len(outs) == 1:
                    return outs[0]
                return outs[0] if src[d] % ways == 0 and size[outs[0]] % ways == 0 else None
        return None

    return _with_local_size(call, _map_dims(call, new_dim_of), size)


@register_prop_rule([aten.select])
def select_rule(call: OpCall) -> OutputSharding:
    """``t[i]`` along ``dim``: a shard of that dim is gathered first; later shard dims move down by one."""
    dim = call.arg(1, "dim") % max(call.specs[0].ndim, 1)
    return _map_dims(call, lambda d: None if d == dim else d - (d > dim))


@register_prop_rule([aten.slice])
def slice_rule(call: OpCall) -> OutputSharding:
    """``t[a:b]`` along ``dim``: a shard of that dim is gathered first (unless the slice is the whole dim)."""
    shape = call.specs[0].shape
    dim = call.arg(1, "dim", 0) % max(len(shape), 1)
    start, end, step = call.arg(2, "start"), call.arg(3, "end"), call.arg(4, "step", 1)
    whole = (start in (None, 0)) and (end is None or end >= shape[dim]) and step == 1
    return _map_dims(call, lambda d: d if d != dim or whole else None)


@register_prop_rule([aten.slice_backward])
def slice_backward_rule(call: OpCall) -> OutputSharding:
    """The gradient of ``t[a:b]`` along ``dim``, zeros around it: a shard of another dim stays (the local op
    given this rank's size); a shard of ``dim`` is gathered first."""
    sizes = list(call.arg(1, "input_sizes"))
    dim = call.arg(2, "dim") % max(len(sizes), 1)
    return _with_local_size(call, _map_dims(call, lambda d: None if d == dim else d), sizes)


@register_prop_rule([aten.view_as_complex])
def view_as_complex_rule(call: OpCall) -> OutputSharding:
    """``[..., 2]`` real pairs as complex numbers: the pair dim goes (a shard of it is gathered first)."""
    last = call.specs[0].ndim - 1
    return _map_dims(call, lambda d: None if d == last else d)


@register_prop_rule([aten.view_as_real, aten._conj, aten.conj_physical, aten._conj_physical, aten.resolve_conj,
                     aten.resolve_neg])
def view_as_real_rule(call: OpCall) -> OutputSharding:
    """Complex numbers as ``[..., 2]`` real pairs (a new last dim), and the conjugate views: shards stay."""
    return _map_dims(call, lambda d: d)
