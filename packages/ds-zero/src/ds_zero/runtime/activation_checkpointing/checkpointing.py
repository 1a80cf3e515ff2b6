"""Activation checkpointing (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016), DeepSpeed's
``deepspeed/runtime/activation_checkpointing/checkpointing.py``.

``checkpoint(function, *args)`` runs ``function`` without recording a graph and keeps only its inputs; backward
replays the forward from them (with the RNG states of the first run, so dropout draws the same masks) and
backpropagates through the replay. ``configure`` adds DeepSpeed's memory options for what is kept:

* ``partition_activations``: each model-parallel rank keeps 1/mp of every floating-point input (they are
  replicated across a tensor-parallel group); backward all-gathers them before the replay.
* ``checkpoint_in_cpu``: the kept inputs live in host memory (on a CPU-only machine, a separate pool) and are
  brought back for the replay.
* ``contiguous_memory_optimization``: the kept partitions are copied into ``number_checkpoints`` preallocated
  slots instead of being allocated one by one (no fragmentation).

Outputs may be any nesting of tuples, lists and dicts. Under ZeRO-3 the replay runs inside backward, so the
prefetch trace records it there.
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from ds_zero.runtime.activation_checkpointing import rng
from ds_zero.runtime.activation_checkpointing.rng import (  # noqa: F401 - DeepSpeed's public names live here
    CudaRNGStatesTracker,
    get_cuda_rng_tracker,
    model_parallel_cuda_manual_seed,
)

logger = logging.getLogger(__name__)


class CheckpointHostPool:
    """Where ``checkpoint_in_cpu`` keeps inputs: host tensors, pinned when a GPU exists, tracked weakly (freed
    with the graph that holds them) so their bytes can be summed."""

    def __init__(self):
        self.pin = torch.cuda.is_available()
        self.live: weakref.WeakSet = weakref.WeakSet()

    def empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(numel, dtype=dtype, device="cpu", pin_memory=self.pin)
        self.live.add(t)
        return t

    def adopt(self, t: torch.Tensor) -> torch.Tensor:
        return self.empty(t.numel(), t.dtype).copy_(t.reshape(-1), non_blocking=True)

    def holds(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(ptr == h.untyped_storage().data_ptr() for h in list(self.live))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in list(self.live))


class _State:
    """What ``configure`` sets (DeepSpeed keeps these as module globals; one object here)."""

    def __init__(self):
        self.configured = False
        self.mpu = None
        self.partition_activations = False
        self.contiguous = False
        self.num_checkpoints = None
        self.cpu_checkpoint = False
        self.host = CheckpointHostPool()
        self.slots: list[list[torch.Tensor]] = []  # contiguous: per input index, num_checkpoints buffers
        self.slot_buffers: list[torch.Tensor] = []
        self.next_slot = 0
        self.alive = 0  # checkpoints whose backward has not run yet

    def mp(self) -> tuple:
        if self.mpu is None:
            return None, 1, 0
        group = self.mpu.get_model_parallel_group()
        return group, dist.get_world_size(group), dist.get_rank(group)


_STATE = _State()


def _is_activation(item, mp_size: int) -> bool:
    """DeepSpeed's ``is_activation_to_checkpoint``: floating-point tensors at least one element per rank."""
    return (torch.is_tensor(item) and item.is_floating_point() and item.numel() >= mp_size
            and not getattr(item, "no_checkpointing", False))


def _keep(args) -> tuple[list, list]:
    """(kept tensors, how to rebuild each arg): the memory options applied to what the replay needs."""
    st = _STATE
    group, mp_size, mp_rank = st.mp()
    kept, recipe = [], []
    for i, a in enumerate(args):
        if not torch.is_tensor(a):
            recipe.append(("value", a))
            continue
        if not _is_activation(a, mp_size) or not (st.partition_activations or st.cpu_checkpoint):
            kept.append(a)
            recipe.append(("tensor", a.requires_grad, a.device))
            continue
        t = a.detach()
        if st.partition_activations and mp_size > 1:
            chunk = -(-t.numel() // mp_size)
            flat = t.contiguous().view(-1)
            part = torch.zeros(chunk, dtype=t.dtype, device=t.device)
            lo, hi = mp_rank * chunk, min((mp_rank + 1) * chunk, t.numel())
            if hi > lo:
                part[: hi - lo].copy_(flat[lo:hi])
        else:
            part = t.contiguous().view(-1)
        part = _store(i, part)
        kept.append(part)
        recipe.append(("partitioned", a.requires_grad, a.device, a.shape, t.numel(), mp_size > 1 and
                       st.partition_activations))
    return kept, recipe


def _store(index: int, part: torch.Tensor) -> torch.Tensor:
    st = _STATE
    if st.contiguous:
        while len(st.slots) <= index:
            st.slots.append([])
        slots = st.slots[index]
        if not slots:
            for _ in range(st.num_checkpoints):
                slots.append(st.host.empty(part.numel(), part.dtype) if st.cpu_checkpoint else
                             torch.empty(part.numel(), dtype=part.dtype, device=part.device))
            st.slot_buffers = [b for sl in st.slots for b in sl]  # the slots live as long as the configuration
        if st.next_slot >= len(slots):
            raise RuntimeError(f"more than number_checkpoints={st.num_checkpoints} activation checkpoints are alive; "
                               "raise activation_checkpointing.number_checkpoints")
        if slots[st.next_slot].numel() != part.numel():
            raise RuntimeError("contiguous_memory_optimization needs checkpoints of one size (homogeneous layers); "
                               f"got {part.numel()} elements after {slots[st.next_slot].numel()}")
        return slots[st.next_slot].copy_(part, non_blocking=True)
    if st.cpu_checkpoint:
        return st.host.adopt(part)
    return part.clone() if st.partition_activations else part


def _rebuild(saved, recipe) -> list:
    group, mp_size, _ = _STATE.mp()
    it = iter(saved)
    out = []
    for r in recipe:
        if r[0] == "value":
            out.append(r[1])
            continue
        t = next(it)
        if r[0] == "tensor":
            out.append(t.detach().requires_grad_(r[1]))
            continue
        _, requires_grad, device, shape, numel, partitioned = r
        t = t.to(device, non_blocking=True)
        if partitioned:
            full = torch.empty(t.numel() * mp_size, dtype=t.dtype, device=device)
            dist.all_gather_into_tensor(full, t.contiguous(), group=group)
            t = full
        out.append(t[:numel].view(shape).clone().requires_grad_(requires_grad))
    return out


class CheckpointFunction(torch.autograd.Function):
    """Forward without a graph, keep the inputs; backward replays and backpropagates (reentrant, as DeepSpeed's)."""

    @staticmethod
    def forward(ctx, run_function, out_meta, *args):
        ctx.run_function = run_function
        ctx.rng_states = rng.capture()
        with torch.no_grad():
            outputs = run_function(*args)
        kept, ctx.recipe = _keep(args)
        # save_for_backward, so saved-tensor hooks (and memory accounting) see exactly what is kept
        ctx.save_for_backward(*kept)
        _STATE.alive += 1
        if _STATE.contiguous:
            _STATE.next_slot += 1
        leaves, spec = pytree.tree_flatten(outputs)
        tensor_idx = [i for i, v in enumerate(leaves) if torch.is_tensor(v)]
        out_meta.append((spec, leaves, tensor_idx))
        # Fresh aliases: autograd makes the returned objects this node's outputs, and a tensor the function
        # merely passed through (a constant it holds) must not become one, or the replay would recurse into it.
        tensors = [leaves[i].detach() for i in tensor_idx]
        ctx.mark_non_differentiable(*[t for t in tensors if not t.is_floating_point()])
        return tuple(tensors)

    @staticmethod
    def backward(ctx, *grads):
        inputs = _rebuild(ctx.saved_tensors, ctx.recipe)
        _STATE.alive -= 1
        if _STATE.alive == 0:
            _STATE.next_slot = 0  # every kept checkpoint was replayed: the slots are free for the next forward
        after_forward = rng.capture()
        rng.restore(ctx.rng_states)
        try:
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
        finally:
            rng.restore(after_forward)
        leaves = [v for v in pytree.tree_leaves(outputs) if torch.is_tensor(v)]
        pairs = [(o, g) for o, g in zip(leaves, grads) if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *[x.grad if torch.is_tensor(x) and x.requires_grad else None for x in inputs])


def checkpoint(function, *args, **kwargs):
    """Checkpoint a model or part of the model (DeepSpeed's ``deepspeed.checkpointing.checkpoint``)."""
    if kwargs:
        # Keyword arguments travel as extra positional ones, so tensors among them are kept and get gradients.
        keys, n = list(kwargs), len(args)

        def with_kwargs(*all_args):
            return function(*all_args[:n], **dict(zip(keys, all_args[n:])))

        return checkpoint(with_kwargs, *args, *kwargs.values())
    if torch.is_grad_enabled() and not any(torch.is_tensor(a) and a.requires_grad for a in args):
        # Reentrant checkpointing differentiates through its inputs only (torch warns the same way).
        logger.warning("checkpoint: none of the inputs requires grad, so nothing inside gets gradients; "
                       "checkpoint from the first layer whose input requires grad")
    meta: list = []
    tensors = CheckpointFunction.apply(function, meta, *args)
    spec, leaves, tensor_idx = meta[0]
    leaves = list(leaves)
    for i, t in zip(tensor_idx, tensors):
        leaves[i] = t
    return pytree.tree_unflatten(leaves, spec)


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None) -> None:
    """DeepSpeed's ``configure``: ``deepspeed_config`` (a :class:`ds_zero.runtime.config.DeepSpeedConfig`) gives
    the ``activation_checkpointing`` section; explicit arguments win over it."""
    st = _STATE
    ac = getattr(deepspeed_config, "activation_checkpointing", None)
    if ac is not None:
        st.partition_activations, st.contiguous = ac.partition_activations, ac.contiguous_memory_optimization
        st.num_checkpoints, st.cpu_checkpoint = ac.number_checkpoints, ac.cpu_checkpointing
    for name, value in (("partition_activations", partition_activations), ("contiguous", contiguous_checkpointing),
                        ("num_checkpoints", num_checkpoints), ("cpu_checkpoint", checkpoint_in_cpu)):
        if value is not None:
            setattr(st, name, value)
    if st.contiguous and not st.num_checkpoints:
        raise ValueError("contiguous_memory_optimization needs number_checkpoints (how many checkpoints a forward "
                         "keeps at once)")
    st.mpu = mpu_
    st.slots, st.next_slot, st.alive = [], 0, 0
    st.configured = True


def is_configured() -> bool:
    return _STATE.configured


def reset() -> None:
    """Free the contiguous slots' positions for the next iteration (DeepSpeed's ``reset``)."""
    _STATE.next_slot = 0
    _STATE.alive = 0


def host_pool() -> CheckpointHostPool:
    """The pool ``checkpoint_in_cpu`` keeps inputs in (for accounting and tests)."""
    return _STATE.host
