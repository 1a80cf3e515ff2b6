"""``deepspeed.utils.tensor_fragment``'s ``safe_get_*`` / ``safe_set_*``: a parameter's fp32 master copy and its
optimizer state, whole (gathered over the data-parallel group) or this rank's fragment, read from the ZeRO
optimizer's partitions by the layout its checkpoints are written with (``layout()``: ``flat`` groups at stages 1-2,
per-parameter ``chunked`` partitions at stage 3). As DeepSpeed's, ``None`` for a parameter no ZeRO optimizer owns
(stage 0, frozen parameters); the engine links its parameters to its optimizer (:func:`link_params`)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def link_params(optimizer) -> None:
    """Let each trainable parameter find the ZeRO optimizer holding its master copy (DeepSpeed's ``_hp_mapping``
    / ``_z3_optimizer`` attributes)."""
    if not hasattr(optimizer, "layout"):
        return
    for g, group in enumerate(optimizer.trainable_param_groups):
        for i, p in enumerate(group):
            p._ds_zero_fragment = (optimizer, g, i)


def _fragment(param, tensors):
    """For ``param`` in one per-group list of partitions (masters, or one optimizer state): ``full(gathered)``
    picks the whole parameter out of the group's gathered partitions; ``local`` is this rank's piece, holding the
    parameter's elements ``[a, b)`` (a stage-3 chunk may end in padding past ``b``)."""
    optimizer, g, i = param._ds_zero_fragment
    layout = optimizer.layout()
    part, n = tensors[g], layout["numels"][g][i]
    if layout["kind"] == "flat":
        off = sum(layout["numels"][g][:i])
        start = optimizer.rank * part.numel() if layout["partition_count"] > 1 else 0
        lo, hi = max(off, start), min(off + n, start + part.numel())
        hi = max(lo, hi)
        return (lambda flat: flat[off:off + n]), part[lo - start:hi - start], lo - off, hi - off
    c, coff = layout["chunks"][g][i], sum(layout["chunks"][g][:i])
    a = optimizer.rank * c
    return ((lambda flat: flat.view(layout["partition_count"], -1)[:, coff:coff + c].reshape(-1)[:n]),
            part[coff:coff + c], min(a, n), min(a + c, n))


def _gathered(optimizer, part: torch.Tensor) -> torch.Tensor:
    if optimizer.layout()["partition_count"] == 1:
        return part
    out = torch.empty(part.numel() * optimizer.world_size, dtype=part.dtype, device=part.device)
    dist.all_gather_into_tensor(out, part.contiguous(), group=optimizer.dp_process_group)
    return out


def _masters(optimizer) -> list:
    if not optimizer.master_partitions:
        raise NotImplementedError("the fp32 master partitions are on NVMe (offload_optimizer device nvme): "
                                  "ds_zero reads them only from memory")
    return optimizer.master_partitions


def _states(optimizer, key: str) -> list:
    states = [optimizer.optimizer.state.get(m, {}) for m in _masters(optimizer)]
    if not all(key in s for s in states):
        have = sorted({k for s in states for k in s})
        raise KeyError(f"optimizer state {key!r} not found (the optimizer holds {have})")
    return [s[key] for s in states]


def _get_full(param, tensors_of):
    if not hasattr(param, "_ds_zero_fragment"):
        return None
    optimizer = param._ds_zero_fragment[0]
    tensors = tensors_of(optimizer)
    full = _fragment(param, tensors)[0]
    g = param._ds_zero_fragment[1]
    return full(_gathered(optimizer, tensors[g])).view(param.ds_shape if hasattr(param, "ds_shape")
                                                        else param.shape).clone()


def _set_full(param, value, tensors_of) -> None:
    if not hasattr(param, "_ds_zero_fragment"):
        return
    tensors = tensors_of(param._ds_zero_fragment[0])
    _, local, a, b = _fragment(param, tensors)
    with torch.no_grad():
        local[:b - a].copy_(value.reshape(-1)[a:b])


def _get_local(param, tensors_of):
    if not hasattr(param, "_ds_zero_fragment"):
        return None
    return _fragment(param, tensors_of(param._ds_zero_fragment[0]))[1]


def safe_get_full_fp32_param(param):
    return _get_full(param, _masters)


def safe_set_full_fp32_param(param, value) -> None:
    _set_full(param, value, _masters)


def safe_get_full_optimizer_state(param, optim_state_key):
    return _get_full(param, lambda opt: _states(opt, optim_state_key))


def safe_set_full_optimizer_state(param, value, optim_state_key) -> None:
    _set_full(param, value, lambda opt: _states(opt, optim_state_key))


def safe_get_local_fp32_param(param):
    return _get_local(param, _masters)


def safe_get_local_optimizer_state(param, optim_state_key):
    return _get_local(param, lambda opt: _states(opt, optim_state_key))


def safe_set_local_fp32_param(param, value) -> None:
    local = _get_local(param, _masters)
    if local is not None:
        with torch.no_grad():
            local.copy_(value.reshape(-1))


def safe_set_local_optimizer_state(param, value, optim_state_key) -> None:
    local = _get_local(param, lambda opt: _states(opt, optim_state_key))
    if local is not None:
        with torch.no_grad():
            local.copy_(value.reshape(-1))
