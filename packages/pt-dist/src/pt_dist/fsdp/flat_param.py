"""``FlatParamHandle``: one FSDP unit's parameters as one flat, padded, sharded parameter (torch's _flat_param.py).

The unit's parameters (each shared one once) are concatenated, padded with zeros to a multiple of the shard
group's size N, and cut into N equal shards; this rank keeps shard r as ``flat_param``, the ``nn.Parameter`` the
optimizer steps. To run the unit, ``unshard`` all-gathers the shards into a full buffer (in ``param_dtype``) and
the module's parameters become views of it; ``reshard`` frees that buffer's storage. After backward, ``reduce_grad``
reduce-scatters the full gradient so this rank keeps only its shard's (NO_SHARD: all-reduce).

The views autograd saves in forward point into the buffer through a leaf tensor (``_unsharded``) that shares
the buffer's storage but not its version counter, so refilling the storage for backward (FULL_SHARD's second
all-gather) does not count as modifying what the graph saved.
"""

from __future__ import annotations

import enum
import itertools
import weakref
from dataclasses import dataclass

import torch
from torch import nn


class HandleTrainingState(enum.Enum):
    IDLE = enum.auto()
    FORWARD = enum.auto()
    BACKWARD_PRE = enum.auto()  # gathered for this unit's backward
    BACKWARD_POST = enum.auto()  # gradient reduced


@dataclass
class ParamInfo:
    """One place a flattened parameter lives: ``module.<name>``, its clean name, and its range of the flat param."""

    module: nn.Module
    name: str
    fqn: str
    offset: int
    numel: int
    shape: torch.Size


class FlatParamHandle:
    """One unit's flat parameter: this rank's shard (``flat_param``), the gathered buffer, the gradient's way back."""

    def __init__(self, named_params, shard_group, replicate_group, sharded: bool, param_dtype, reduce_dtype):
        """``named_params``: ``(module, attr, clean fqn, parameter)`` for every place a parameter of the unit is
        registered, in module order (a tied parameter appears twice, stored once)."""
        named_params, uniques, index, self._piece_of = list(named_params), [], {}, []
        for _, _, _, p in named_params:
            if id(p) not in index:
                index[id(p)] = len(uniques)
                uniques.append(p)
            self._piece_of.append(index[id(p)])
        self._numels = [p.numel() for p in uniques]
        devices = {p.device for p in uniques}
        if len(devices) != 1:
            raise ValueError(
                f"FullyShardedDataParallel: one unit's parameters must be on one device, got "
                f"{sorted(map(str, devices))}; move the module first (or pass device_id)"
            )
        self.device = devices.pop()  # CPU on the native backends, a GPU through the nccl adapter
        dtypes = {p.dtype for p in uniques}
        if len(dtypes) != 1:
            names = [f"{fqn} ({p.dtype})" for _, _, fqn, p in named_params][:6]
            raise ValueError(
                f"FullyShardedDataParallel: one unit's parameters must share a dtype to be flattened, "
                f"got {sorted(map(str, dtypes))}: {names}; wrap them in separate units"
            )
        self.requires_grad = self._flat_requires_grad(named_params, uniques)
        self.shard_group, self.replicate_group, self.sharded = shard_group, replicate_group, sharded
        world = shard_group.size() if sharded else 1
        dtype = uniques[0].dtype
        self._offsets = self._flat_offsets(uniques)
        self.infos = [ParamInfo(module, name, fqn, self._offsets[index[id(p)]], p.numel(), p.shape)
                      for module, name, fqn, p in named_params]
        self.numel = self._offsets[-1] + self._numels[-1]
        self.padded_numel = -(-self.numel // world) * world
        self.shard_numel = self.padded_numel // world
        self._mp_param_dtype, self._mp_reduce_dtype = param_dtype, reduce_dtype
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=self.device)
        with torch.no_grad():
            for p, offset in zip(uniques, self._offsets):
                flat.narrow(0, offset, p.numel()).copy_(p.reshape(-1))
        start = (shard_group.rank() if sharded else 0) * self.shard_numel
        shard = _shard_storage(shard_group if sharded else None, self.shard_numel, dtype, self.device)
        self.flat_param = nn.Parameter(
            shard.copy_(flat.narrow(0, start, self.shard_numel)), requires_grad=self.requires_grad
        )
        for info in self.infos:  # the module's parameters are views of the gathered buffer from now on
            info.module._parameters.pop(info.name, None)
        self._full = torch.empty(
            0, dtype=self.param_dtype, device=self.device
        )  # the gathered buffer (storage freed when resharded)
        self._unsharded: torch.Tensor | None = None  # the leaf the module's views come from
        self._gather: tuple | None = None  # (work, the shard it reads) while an all-gather is in flight
        self._reduce: tuple | None = None  # (work, output, input) while a reduction is in flight
        self.is_unsharded = False
        self.state = HandleTrainingState.IDLE
        self.post_backward_calls = 0
        self._kept = False  # flat_param.grad holds what no_sync() accumulated (sharded: the unsharded gradient)
        self._saved_grad_shard: torch.Tensor | None = None  # a synced shard set aside meanwhile (torch's name)
        self.comm_hook: tuple | None = None  # (state, hook) from FSDP.register_comm_hook

    # -- flattening ----------------------------------------------------------------------------------------------

    @staticmethod
    def _flat_requires_grad(named_params, uniques) -> bool:
        """One flat parameter is trainable or frozen as a whole."""
        trainable = {p.requires_grad for p in uniques}
        if len(trainable) != 1:
            frozen = [fqn for _, _, fqn, p in named_params if not p.requires_grad][:6]
            raise ValueError(
                f"FullyShardedDataParallel: a unit mixes frozen parameters ({frozen}) with trainable "
                f"ones; wrap the frozen ones in a unit of their own, or pass them in ignored_modules"
            )
        return trainable.pop()

    @staticmethod
    def _flat_offsets(uniques) -> list[int]:
        """Where each parameter starts in the flat parameter: one after another."""
        return list(itertools.accumulate((p.numel() for p in uniques[:-1]), initial=0))

    def views_of(self, flat: torch.Tensor) -> list:
        """Each distinct parameter's 1-D range of a whole flat tensor (the gathered parameter, a state, a gradient),
        by one split: its backward concatenates the gradients into one buffer (a narrow per parameter would make a
        zero-filled full-size gradient per parameter for autograd to sum)."""
        return list((flat if flat.numel() == self.numel else flat.narrow(0, 0, self.numel)).split(self._numels))

    def managed_params(self) -> tuple:
        """The parameters this handle puts on modules (state dicts save them through the handle)."""
        return (self.flat_param,)

    # -- parameters ----------------------------------------------------------------------------------------------

    @property
    def param_dtype(self) -> torch.dtype:
        """The gathered parameters' dtype: mixed precision's, else the flat parameter's own (which follows a
        ``model.half()`` after wrapping, as torch's, whose buffers are sized at the first forward)."""
        return self._mp_param_dtype or self.flat_param.dtype

    @property
    def reduce_dtype(self) -> torch.dtype:
        return self._mp_reduce_dtype or self.param_dtype

    def _full_bytes(self) -> int:
        return self.padded_numel * self.param_dtype.itemsize

    def unshard(self, async_op: bool = False) -> None:
        """Start the all-gather (``async_op``: return at once, a prefetch) or finish it."""
        if self._full.dtype != self.param_dtype and self._gather is None:  # the module was cast since
            self._full.untyped_storage().resize_(0)
            self._full = torch.empty(0, dtype=self.param_dtype, device=self.device)
            self._unsharded, self.is_unsharded = None, False
        if self.is_unsharded:
            return
        if self._gather is None:
            storage = self._full.untyped_storage()
            if storage.nbytes() != self._full_bytes():
                storage.resize_(self._full_bytes())
                self._full.set_(storage, 0, (self.padded_numel,), (1,))
            shard = self.flat_param.detach().to(self.param_dtype)  # (a copy only under mixed precision)
            if self.sharded and self.shard_group.size() > 1:  # (blocking: on this thread when nothing is queued)
                work = self.shard_group.all_gather_into_tensor(self._full, shard, async_op=async_op)
            else:
                self._full.copy_(shard)
                work = None
            self._gather = (work, shard)
        if not async_op:
            work, _ = self._gather
            if work is not None:
                work.wait()
            self._gather, self.is_unsharded = None, True

    def use_unsharded_views(self, new_leaf: bool) -> None:
        """Point the module's parameter attributes at views of the gathered buffer. ``new_leaf`` (each forward that
        builds a graph): a fresh leaf whose gradient hook reduces this unit's gradient, unless the last one's hook
        has not run yet: a unit run twice in one forward (as torch's, whose flat parameter is one leaf) feeds one
        leaf, so autograd sums both uses' gradients before the hook reduces them and frees the buffer."""
        pending = self._unsharded is not None and self._unsharded.requires_grad and self.post_backward_calls == 0
        if (new_leaf and not pending) or self._unsharded is None:
            leaf = torch.empty(0, dtype=self.param_dtype, device=self.device).set_(
                self._full.untyped_storage(), 0, (self.numel,), (1,)
            )
            self._unsharded = leaf.requires_grad_(self.requires_grad and torch.is_grad_enabled())
            self.post_backward_calls = 0
            if leaf.requires_grad:
                # weakly: a tensor's hooks are not seen by the garbage collector while views share the tensor, so a
                # strong reference back would keep the unit, its groups and their shared memory alive for good
                handle = weakref.ref(self)
                leaf.register_post_accumulate_grad_hook(lambda t: handle().on_post_backward())
        self._setattr_views(self.views_of(self._unsharded))

    def _setattr_views(self, views: list) -> None:
        """Each place a parameter lives (``module.<name>``) set to its view, shaped as the parameter."""
        for info, piece in zip(self.infos, self._piece_of):
            setattr(info.module, info.name, views[piece].view(info.shape))

    def on_post_backward(self) -> None:  # set by the unit (fully_sharded_data_parallel.py)
        """Called once the whole unsharded gradient is accumulated."""

    def reshard(self) -> None:
        """Free the gathered buffer (the views and the leaf keep their shapes, not their data)."""
        if self._gather is not None:  # a prefetch nobody used: finish it before freeing what it writes
            self.unshard()
        self._full.untyped_storage().resize_(0)
        self.is_unsharded = False

    # -- gradients -----------------------------------------------------------------------------------------------

    def keep_unsharded_grad(self) -> None:
        """Inside ``no_sync()``: this backward's whole gradient added to ``flat_param.grad``, nothing communicated,
        as torch's. Sharded, that ``.grad`` is the unsharded gradient on the shard-sized parameter (set through
        ``.data``, as torch's), and a synced step's shard found there waits aside for the next reduction's."""
        grad, self._unsharded.grad = self._unsharded.grad.reshape(-1), None
        fp = self.flat_param
        if not self.sharded:
            self._accumulate_grad(grad.to(fp.dtype))
        elif self._kept and fp.grad is not None:
            fp.grad.data.add_(grad)
        else:  # the first one (kept, or zeroed since and so dropped, as torch's)
            if not self._kept:
                self._saved_grad_shard = fp.grad
            fp.grad = torch.empty_like(fp)
            fp.grad.data = grad
        self._kept = True

    def reduce_grad(self, world: int) -> None:
        """Start averaging this unit's gradient over ``world`` data-parallel ranks: reduce-scatter within the shard
        group (each rank its shard), or all-reduce when not sharded (plus what ``no_sync()`` kept)."""
        grad, self._unsharded.grad = self._unsharded.grad, None
        flat, fp = grad.reshape(-1), self.flat_param
        if self._kept and fp.grad is not None:  # reduced with this one (NO_SHARD: the result lands in it, zeroed)
            flat = flat + fp.grad.to(flat.dtype)
            fp.grad.zero_()
        if self._kept and self.sharded:
            fp.grad, self._saved_grad_shard = self._saved_grad_shard, None
        self._kept = False
        world = 1 if self.comm_hook is not None else world  # (a hook divides as it chooses)
        if self.padded_numel == self.numel and grad.dtype == self.reduce_dtype:
            padded = flat.div_(world)  # divide first: no overflow in fp16 (the gradient is ours to change)
        else:
            padded = torch.empty(self.padded_numel, dtype=self.reduce_dtype, device=self.device)
            padded.narrow(0, self.numel, self.padded_numel - self.numel).zero_()  # the padding's gradient
            torch.div(flat, world, out=padded.narrow(0, 0, self.numel))
        if self.comm_hook is not None:  # FSDP.register_comm_hook's (state, hook) reduces in place of the collective
            state, hook = self.comm_hook
            out = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=self.device) if self.sharded else padded
            hook(state, padded, *([out] if self.sharded else []))
            work = None
        elif self.sharded and self.shard_group.size() > 1:
            out = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=self.device)
            work = self.shard_group.reduce_scatter_tensor(out, padded, async_op=True)
        else:
            out = padded
            work = self.shard_group.all_reduce(out, async_op=True) if self.shard_group.size() > 1 else None
        self._reduce = (work, out, padded)

    def finish_reduce(self) -> None:
        """Wait for the reduction, sum over the replicas (HYBRID_SHARD), accumulate into ``flat_param.grad``."""
        if self._reduce is None:
            return
        work, out, _ = self._reduce
        self._reduce = None
        if work is not None:
            work.wait()
        if self.replicate_group is not None and self.replicate_group.size() > 1:
            self.replicate_group.all_reduce(out).wait()
        self._accumulate_grad(out.to(self.flat_param.dtype))

    def _accumulate_grad(self, grad: torch.Tensor) -> None:
        if self.flat_param.grad is None:
            self.flat_param.grad = grad
        else:
            self.flat_param.grad += grad

    # -- state dicts ---------------------------------------------------------------------------------------------

    def full_flat(self) -> torch.Tensor:
        """The whole flat parameter in its own dtype (collective within the shard group)."""
        if not (self.sharded and self.shard_group.size() > 1):
            return self.flat_param.detach().clone()
        full = torch.empty(self.padded_numel, dtype=self.flat_param.dtype, device=self.device)
        self.shard_group.all_gather_into_tensor(full, self.flat_param.detach()).wait()
        return full

    def load_full_flat(self, flat: torch.Tensor) -> None:
        start = (self.shard_group.rank() if self.sharded else 0) * self.shard_numel
        padded = torch.zeros(self.padded_numel, dtype=self.flat_param.dtype, device=self.device)
        padded.narrow(0, 0, self.numel).copy_(flat.narrow(0, 0, self.numel))
        with torch.no_grad():
            self.flat_param.copy_(padded.narrow(0, start, self.shard_numel))


def _shard_storage(group, numel: int, dtype, device) -> torch.Tensor:
    """Where this rank's shard lives: on an shm group whose symmetric heap has room, in the heap, so each
    all-gather reads the peers' shards where they lie instead of copying them through the kernel (every rank
    decides alike: ranks building the same model allocate alike); a plain tensor otherwise."""
    free = getattr(group, "symmetric_free_bytes", None)
    nbytes = numel * dtype.itemsize + 4096  # (page-aligned)
    if free is None or group.size() == 1 or device.type != "cpu" or free() < nbytes:
        return torch.empty(numel, dtype=dtype, device=device)
    return group.symmetric_empty(numel, dtype=dtype)
