"""torch's ``FullyShardedDataParallel.summon_full_params``: the whole parameters outside forward
(torch/distributed/fsdp/_unshard_param_utils.py).

Inside ``summon_full_params`` each unit's flat parameter is all-gathered in its own dtype (never the mixed
precision one) into a buffer of its own, and the flat parameter's data is that buffer (unpadded, as torch's
``_use_unsharded_flat_param``); the module's original parameters are registered again as ``nn.Parameter`` views
of it (the flat parameter is taken out of ``parameters()`` meanwhile, as torch's ``_unflatten_as_params``), so
``model.parameters()``, ``named_parameters()`` and ``model.weight`` are the full tensors. At exit the flat
parameter is its shard again; with ``writeback`` the rank first copies its shard's range of the buffer into it.
Unsharded (NO_SHARD, one rank) the buffer is the flat parameter itself, so changes persist either way, as
torch's (``use_orig_params=True``: the original parameter objects become the views, and ``with_grads`` gathers
their gradients too). ``rank0_only`` gathers on every rank but shows the full parameters on rank 0 only. A unit whose
parameters were still gathered (the root after a forward) has them gathered again afterwards, as torch's.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from pt_dist._compat.fsdp._traversal_utils import fsdp_modules
from pt_dist._compat.fsdp.use_orig_params import OrigParamsHandle
from pt_dist.fsdp._common_utils import FLAT_PARAM
from pt_dist.fsdp._runtime_utils import FullyShardedDataParallel
from pt_dist.fsdp.flat_param import HandleTrainingState


def _validate(unit, writeback: bool, rank0_only: bool, offload_to_cpu: bool, with_grads: bool) -> None:
    """torch's ``_validate_unshard_params_args``."""
    if with_grads and (offload_to_cpu or not unit._use_orig_params):
        raise NotImplementedError(f"with_grads={with_grads}, use_orig_params={unit._use_orig_params}, "
                                  f"offload_to_cpu={offload_to_cpu} is not supported yet")
    if offload_to_cpu and unit._handle is not None and not unit._handle.sharded:
        raise NotImplementedError("offload_to_cpu=True and NO_SHARD is not supported yet")
    if writeback and rank0_only:
        raise NotImplementedError("writeback=True and rank0_only=True is not supported yet")
    if offload_to_cpu and not rank0_only:
        warnings.warn("offload_to_cpu=True and rank0_only=False may copy the unsharded parameters to CPU memory "
                      "once per rank sharing it; offload_to_cpu=True with rank0_only=True is recommended",
                      stacklevel=4)


@contextlib.contextmanager
def _summon_unit(unit, writeback: bool, rank0_only: bool, with_grads: bool = False):
    handle = unit._handle
    if any(h.state is not HandleTrainingState.IDLE for h in _handles(unit._root)):
        raise AssertionError("Cannot manually unshard parameters during forward/backward")
    if getattr(unit, "_summoned", False):
        raise AssertionError("Cannot manually unshard parameters when already unsharding parameters")
    if handle is None:
        unit._summoned = True
        try:
            yield
        finally:
            unit._summoned = False
        return
    was_unsharded = handle.is_unsharded  # the root's buffer, kept after a forward: stale once written back
    if was_unsharded:
        handle.reshard()
    sharded = handle.sharded and handle.shard_group.size() > 1
    # collective within the shard group: every rank, rank0_only or not
    full = handle.full_flat() if sharded else handle.flat_param.detach()
    show = not rank0_only or handle.shard_group.rank() == 0 and _replica_rank(handle) == 0
    owner = handle.owner  # the module holding the flat parameter (a wrapper may have replaced it since)
    saved: list = []
    shard = handle.flat_param.data
    if isinstance(handle, OrigParamsHandle):
        with _orig_summoned(unit, handle, full, shard, show, with_grads, writeback and sharded):
            yield
        if was_unsharded:  # the module's views of the gathered buffer back, as before the summon
            handle.unshard()
            handle.use_unsharded_views(new_leaf=False)
        return
    if show:
        owner._parameters.pop(FLAT_PARAM)
        handle.flat_param.data = full.narrow(0, 0, handle.numel)
        pieces = handle.views_of(full)
        made = {}
        for info, piece in zip(handle.infos, handle._piece_of):
            if piece not in made:  # a tied parameter is one Parameter, registered in each place
                made[piece] = nn.Parameter(pieces[piece].view(info.shape), requires_grad=handle.requires_grad)
            saved.append((info, info.module.__dict__.pop(info.name, None)))
            info.module.register_parameter(info.name, made[piece])
    unit._summoned = True
    try:
        yield
    finally:
        unit._summoned = False
        if show:
            for info, old in reversed(saved):
                info.module._parameters.pop(info.name, None)
                if old is not None:
                    info.module.__dict__[info.name] = old
            handle.flat_param.data = shard
            owner.register_parameter(FLAT_PARAM, handle.flat_param)
        if writeback and show and sharded:
            _writeback_to_local_shard(handle, full)
        if was_unsharded:
            handle.unshard()


@contextlib.contextmanager
def _orig_summoned(unit, handle, full, shard, show: bool, with_grads: bool, writeback: bool):
    """``use_orig_params=True``: the original parameters themselves are the full ones inside (their gradients too,
    with ``with_grads``: gathered, None where every rank's is; ``writeback`` keeps what was written to them too,
    as torch's ``_writeback_to_local_shard(handle, writeback_grad=with_grads)``)."""
    grads = handle.full_grads() if with_grads else None  # (collective: every rank)
    if show:
        handle.flat_param.data = full.narrow(0, 0, handle.numel)
        handle.use_full_views(full.narrow(0, 0, handle.numel))
        views = handle.views_of(grads) if grads is not None else handle.params
        for p, g, shape in zip(handle.params, views, handle.shapes):
            if with_grads:
                p.grad = g.view(shape) if grads is not None else None  # (a frozen one's zeros too, as torch's)
    unit._summoned = True
    try:
        yield
    finally:
        unit._summoned = False
        handle.flat_param.data = shard
        if writeback and show:
            _writeback_to_local_shard(handle, full)
            if grads is not None and handle.flat_param.grad is not None:
                _writeback_to_local_shard(handle, grads, handle.flat_param.grad)
        handle.use_sharded_views()
        if with_grads:
            handle.use_grad_views()


def _writeback_to_local_shard(handle, full, shard=None) -> None:
    """The shard's range of ``full`` into the shard (default the flat parameter), its padding left as it is
    (torch's)."""
    start = handle.shard_group.rank() * handle.shard_numel
    n = max(0, min(handle.shard_numel, handle.numel - start))
    with torch.no_grad():
        (handle.flat_param if shard is None else shard).narrow(0, 0, n).copy_(full.narrow(0, start, n))


def _replica_rank(handle) -> int:
    group = handle.replicate_group
    return 0 if group is None else group.rank()


def _handles(root):
    return [u._handle for u in root._units if u._handle is not None]


@contextlib.contextmanager
def summon_full_params(module: nn.Module, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                       offload_to_cpu: bool = False, with_grads: bool = False):
    """The full parameters of every FSDP unit in ``module`` (``recurse``) or of ``module``'s own unit only."""
    units = fsdp_modules(module)
    if not recurse:
        units = units[:1] if isinstance(module, FullyShardedDataParallel) else []
    for unit in units:
        _validate(unit, writeback, rank0_only, offload_to_cpu, with_grads)
    with contextlib.ExitStack() as stack:
        for unit in units:
            unit._lazy_init()
            stack.enter_context(_summon_unit(unit, writeback, rank0_only, with_grads))
        yield
