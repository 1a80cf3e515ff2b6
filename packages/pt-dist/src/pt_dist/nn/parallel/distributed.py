"""``DistributedDataParallel``: replicate a module on every rank, average gradients during backward.

torch's torch/nn/parallel/distributed.py over any pt_dist group (tcp, shm, the gloo/nccl adapters).
Construction checks that every rank built the same model and broadcasts rank 0's parameters and buffers;
each forward may broadcast the buffers again (``broadcast_buffers``) and prepares the ``Reducer``
(``reducer.py``), which does the backward's work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import logging

import torch
from torch.nn import Module

from pt_dist import distributed_c10d as c10d
from pt_dist.nn.parallel.bucketing import _DEFAULT_FIRST_BUCKET_BYTES, GradBucket, _compute_bucket_assignment_by_size
from pt_dist.nn.parallel.reducer import Reducer
from pt_dist.object_collectives import all_gather_object
from pt_dist.utils import _broadcast_coalesced

log = logging.getLogger(__name__)

_DEFAULT_BUCKET_CAP_MB = 25
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024  # torch's broadcast_bucket_size for module states


def _find_tensors(obj):
    """Every tensor in a forward's output: tensors, lists, tuples, dicts, dataclasses (torch's ``_find_tensors``)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return list(itertools.chain.from_iterable(map(_find_tensors, obj)))
    if isinstance(obj, dict):
        return list(itertools.chain.from_iterable(map(_find_tensors, obj.values())))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return list(itertools.chain.from_iterable(_find_tensors(getattr(obj, f.name))
                                                  for f in dataclasses.fields(obj)))
    return []


def _verify_param_shape_across_processes(process_group, named_tensors) -> None:
    """Raise on every rank, naming the first difference, unless all ranks hold the same names, shapes and dtypes
    (torch's ``_verify_param_shape_across_processes``)."""
    mine = [(name, tuple(t.shape), str(t.dtype)) for name, t in named_tensors]
    everyone = [None] * process_group.size()
    all_gather_object(everyone, mine, group=process_group)
    ranks = c10d.get_process_group_ranks(process_group)
    reference = everyone[0]
    for group_rank, theirs in enumerate(everyone[1:], start=1):
        for k, (ref, got) in enumerate(itertools.zip_longest(reference, theirs)):
            if ref != got:
                what = ("has no tensor" if got is None else f"has {got[0]!r} with shape {got[1]} ({got[2]})")
                want = ("none" if ref is None else f"{ref[0]!r} with shape {ref[1]} ({ref[2]})")
                raise RuntimeError(f"DistributedDataParallel: every rank must build the same model, but at "
                                   f"parameter/buffer #{k} rank {ranks[group_rank]} {what} where rank {ranks[0]} "
                                   f"has {want}")


def _check_comm_hook(hook) -> None:
    """torch's checks: callable, annotations (if any) naming GradBucket and Future."""
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")
    sig = inspect.signature(hook)
    bucket = sig.parameters.get("bucket")
    ann = inspect.Parameter.empty if bucket is None else bucket.annotation
    if ann is not inspect.Parameter.empty and ann not in (GradBucket, torch.distributed.GradBucket) and not (
            isinstance(ann, str) and ann.endswith("GradBucket")):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    ret = sig.return_annotation
    if ret is not inspect.Signature.empty and getattr(ret, "__origin__", ret) not in (
            torch.futures.Future, torch._C.Future) and not (isinstance(ret, str) and "Future" in ret):
        raise ValueError("Communication hook: return annotation should be torch.futures.Future[torch.Tensor].")


class DistributedDataParallel(Module):
    """Data parallelism at the module level: each rank runs the whole module on its slice of the batch; gradients are
    averaged during backward, bucket by bucket, so every rank's optimizer takes the same step."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None):
        super().__init__()
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("mixed_precision", mixed_precision), ("device_mesh", device_mesh)):
            if value is not None:
                raise ValueError(f"DistributedDataParallel: {name} is not supported, got {value!r}")
        if dim != 0:
            raise ValueError(f"DistributedDataParallel: only dim=0 is supported, got {dim}")
        if bucket_cap_mb is not None and (isinstance(bucket_cap_mb, bool) or not bucket_cap_mb > 0):
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
        devices = {p.device for p in module.parameters()}
        if len(devices) > 1:
            raise ValueError(f"DistributedDataParallel: the module's parameters must be on one device, got "
                             f"{sorted(map(str, devices))}")
        if device_ids:
            want = torch.device("cuda", device_ids[0]) if isinstance(device_ids[0], int) else torch.device(
                device_ids[0])
            if len(device_ids) != 1 or devices != {want}:
                raise ValueError(f"DistributedDataParallel: device_ids must be None (CPU modules) or the module's "
                                 f"one GPU, got {device_ids!r} for parameters on {sorted(map(str, devices))}")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter that "
                               "requires a gradient.")
        sparse = [n for n, m in module.named_modules() if getattr(m, "sparse", False) is True]
        if sparse:
            raise NotImplementedError(f"DistributedDataParallel: sparse gradients ({sparse}) are not supported")
        if process_group is None:
            if not c10d.is_initialized():
                raise ValueError("DistributedDataParallel: the default process group has not been initialized; "
                                 "call pt_dist.init_process_group first or pass process_group")
            process_group = c10d.group.WORLD
        if find_unused_parameters and static_graph:
            log.warning("DistributedDataParallel: static_graph=True finds unused parameters itself; "
                        "find_unused_parameters=True is not needed")
        self.module, self.process_group, self.device_ids = module, process_group, device_ids
        self.output_device = output_device
        self.broadcast_buffers, self.find_unused_parameters = broadcast_buffers, find_unused_parameters
        self.gradient_as_bucket_view, self.static_graph = gradient_as_bucket_view, static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        cap_mb = _DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.bucket_bytes_cap = int(cap_mb * 1024 * 1024)
        # the small first bucket only with the default cap, as torch's _BucketCapacityConfig
        first_cap = min(_DEFAULT_FIRST_BUCKET_BYTES, self.bucket_bytes_cap) if bucket_cap_mb is None \
            else self.bucket_bytes_cap
        self.modules_buffers = [b for _, b in module.named_buffers()]
        states = [*module.named_parameters(), *module.named_buffers()]
        _verify_param_shape_across_processes(process_group, states)
        if init_sync:
            _broadcast_coalesced(process_group, [t.detach() for _, t in states], _BROADCAST_BUCKET_BYTES, 0)
        params = [p for _, p in named]
        # buckets walk the parameters backwards (the order gradients roughly arrive in), the first one small
        backwards = list(reversed(range(len(params))))
        indices, limits = _compute_bucket_assignment_by_size(
            [params[i] for i in backwards], [first_cap, self.bucket_bytes_cap], tensor_indices=backwards)
        self.reducer = Reducer(params, indices, limits, process_group, bucket_bytes_cap=self.bucket_bytes_cap,
                               find_unused_parameters=find_unused_parameters,
                               gradient_as_bucket_view=gradient_as_bucket_view,
                               param_to_name_mapping={i: n for i, (n, _) in enumerate(named)},
                               first_bucket_bytes_cap=first_cap)
        if static_graph:
            self._set_static_graph()

    def _set_static_graph(self) -> None:
        self.static_graph = True
        self.reducer._set_static_graph()

    def forward(self, *inputs, **kwargs):
        syncing = torch.is_grad_enabled() and self.require_backward_grad_sync
        if syncing:
            self.reducer.prepare_for_forward()
        if torch.is_grad_enabled() and self.reducer._rebuild_buckets():
            log.info("Reducer buckets have been rebuilt in this iteration.")
        if self.require_forward_param_sync and self.broadcast_buffers and self.modules_buffers:
            self._sync_buffers()
        output = self.module(*inputs, **kwargs)
        if syncing:
            self.require_forward_param_sync = True
            tensors = _find_tensors(output)
            self.reducer.prepare_for_backward(tensors if self.find_unused_parameters and not self.static_graph
                                              else [])
            self.reducer._watch_outputs(tensors)
        else:
            self.require_forward_param_sync = False
        return output

    def _sync_buffers(self) -> None:
        """Rank 0's buffers (batch-norm statistics) to every rank, before the forward (``broadcast_buffers``).
        Written through aliases with their own version counters: an earlier forward's graph may have saved a buffer
        (CPU batch norm saves its running statistics), and the write must not invalidate that backward. The list
        is read again each time (torch's ``_assign_modules_buffers``): a module may have reassigned a buffer."""
        self.modules_buffers = [b for _, b in self.module.named_buffers()]
        with torch.no_grad():
            aliases = [torch.empty(0, dtype=b.dtype, device=b.device).set_(b.untyped_storage(), b.storage_offset(),
                                                                          b.shape, b.stride())
                       for b in self.modules_buffers]
            _broadcast_coalesced(self.process_group, aliases, _BROADCAST_BUCKET_BYTES, 0)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the first one outside averages the sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state, hook) -> None:
        """``hook(state, bucket: GradBucket) -> torch.futures.Future`` replaces each bucket's all-reduce; the future's
        tensor (or list of one) becomes the bucket's averaged gradients. Once, before the first backward."""
        _check_comm_hook(hook)
        self.reducer.register_comm_hook(state, hook)

    def _get_ddp_logging_data(self) -> dict:
        return {"static_graph": int(self.static_graph), "bucket_cap_bytes": self.bucket_bytes_cap,
                "find_unused_parameters": int(self.find_unused_parameters),
                "gradient_as_bucket_view": int(self.gradient_as_bucket_view), "is_multi_device_module": 0}
