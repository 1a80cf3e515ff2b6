"""ZeRO-3 parameter partitioning (Rajbhandari et al., "ZeRO", 2020, section 5.3: P_os+g+p).

Each parameter is split into ``world_size`` equal chunks (the last one zero-padded); rank r keeps
chunk r in ``param.ds_tensor`` and ``param.data`` is swapped for an empty tensor. Gathering
all-gathers the chunks back into ``param.data``; releasing empties it again. Mirrors
``deepspeed/runtime/zero/partition_parameters.py`` (``zero.Init``, ``GatheredParameters``,
``ZeroParamStatus``).
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_ids = itertools.count()


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1  # param.data holds the full tensor
    NOT_AVAILABLE = 2  # param.data is empty; only ds_tensor (this rank's chunk) exists
    INFLIGHT = 3  # an async all-gather is filling it


def _world(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


# gloo's all-gather slows down past ~12 MiB per rank (8.4M fp32 elements over 2 ranks: 130-154 ms in one piece,
# 35-39 ms in pieces of 1-2M elements; its all-reduce has no such step), so on gloo a piece is at most 8 MiB per rank.
GLOO_ALLGATHER_PIECE_BYTES = 8 << 20


def all_gather_rows(rows: torch.Tensor, send: torch.Tensor, group, piece: int, async_op: bool = False) -> list:
    """Every rank's ``send`` into its row of ``rows`` (world x n), written in place, in column pieces of at most
    ``piece`` elements (equal pieces of at most ``GLOO_ALLGATHER_PIECE_BYTES`` per rank on gloo). Returns the works."""
    n, size = rows.shape[1], rows.element_size()
    if dist.get_backend(group) == "gloo" and piece * size > GLOO_ALLGATHER_PIECE_BYTES:
        piece = -(-n // -(-n * size // GLOO_ALLGATHER_PIECE_BYTES))
    if piece >= n:
        return [dist.all_gather_into_tensor(rows.view(-1), send, group=group, async_op=async_op)]
    return [dist.all_gather(list(rows[:, s:s + piece].unbind(0)), send[s:s + piece], group=group, async_op=async_op)
            for s in range(0, n, piece)]


def is_zero_param(p: torch.Tensor) -> bool:
    return hasattr(p, "ds_id")


def chunk_numel(numel: int, world_size: int) -> int:
    return -(-numel // world_size)


def _empty_like(p: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=p.dtype, device=p.device)


def _global(group, group_rank: int) -> int:
    """torch's broadcast takes a global ``src`` even with a subgroup."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def partition_param(p: torch.nn.Parameter, group=None, broadcast: bool = True) -> None:
    """Turn a full parameter into a ZeRO-3 one; the group's rank 0's values win so all ranks agree."""
    if is_zero_param(p):
        return
    if p.is_meta:
        raise RuntimeError("cannot partition a parameter on the meta device; materialise it first (to_empty)")
    world, rank = _world(group)
    if broadcast and world > 1:
        dist.broadcast(p.data, src=_global(group, 0), group=group)
    c = chunk_numel(p.numel(), world)
    flat = p.data.reshape(-1)
    chunk = torch.zeros(c, dtype=p.dtype, device=p.device)
    lo, hi = rank * c, min((rank + 1) * c, p.numel())
    if hi > lo:
        chunk[: hi - lo].copy_(flat[lo:hi])
    p.ds_id = next(_ids)
    p.ds_shape = p.shape
    p.ds_numel = p.numel()
    p.ds_tensor = chunk
    p.ds_persist = False
    p.ds_group = group
    p.ds_status = ZeroParamStatus.NOT_AVAILABLE
    p.data = _empty_like(p)


class AllGatherHandle:
    """One coalesced all-gather of several parameters' chunks; ``wait()`` installs the full tensors."""

    def __init__(self, params: list, group, async_op: bool):
        self.params = params
        world, _ = _world(group)
        self.world = world
        sizes = [p.ds_tensor.numel() for p in params]
        self.sizes = sizes
        # Partitions may live in host memory (offload_param); the collective runs where the params compute.
        device = params[0].data.device
        send = torch.cat([p.ds_tensor.to(device, non_blocking=True) for p in params]) if len(params) > 1 \
            else params[0].ds_tensor.to(device).contiguous()
        self.recv = torch.empty(world * send.numel(), dtype=send.dtype, device=send.device)
        self.works = all_gather_rows(self.recv.view(world, -1), send, group, send.numel(), async_op)
        for p in params:
            p.ds_status = ZeroParamStatus.INFLIGHT

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()
        self.works = []
        rows = self.recv.view(self.world, -1)
        off = 0
        for p, c in zip(self.params, self.sizes):
            full = rows[:, off:off + c].reshape(-1)[: p.ds_numel]
            p.data = full.view(p.ds_shape).to(p.ds_tensor.dtype)
            p.ds_status = ZeroParamStatus.AVAILABLE
            off += c
        self.params = []
        swapped, self.swapped = getattr(self, "swapped", []), []
        if swapped:
            swapped[0].ds_swapper.release(swapped)


def gather_params(params, async_op: bool = False) -> AllGatherHandle | None:
    """All-gather the not-yet-available ZeRO params (grouped by process group), one collective each.

    Partitions on NVMe (``param.ds_swapper``) are read in first and their buffers handed back once gathered."""
    todo = [p for p in params if is_zero_param(p) and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    if not todo:
        return None
    swapped = [p for p in todo if getattr(p, "ds_swapper", None) is not None]
    if swapped:
        swapper = swapped[0].ds_swapper
        if len(swapped) > swapper.capacity():
            # More partitions than swap buffers (gathering a whole model): as many at a time as fit.
            n = max(1, swapper.capacity())
            for i in range(0, len(todo), n):
                gather_params(todo[i:i + n])
            return None
        swapper.swap_in(swapped)
    group = todo[0].ds_group
    handle = AllGatherHandle(todo, group, async_op)
    handle.swapped = swapped
    if not async_op:
        handle.wait()
    return handle


def release_param(p: torch.nn.Parameter) -> None:
    if is_zero_param(p) and not p.ds_persist and p.ds_status == ZeroParamStatus.AVAILABLE:
        p.data = _empty_like(p)
        p.ds_status = ZeroParamStatus.NOT_AVAILABLE


def repartition_param(p: torch.nn.Parameter) -> None:
    """Copy this rank's slice of the (possibly modified) full ``p.data`` back into ``ds_tensor`` (and its file)."""
    world, rank = _world(p.ds_group)
    swapper = getattr(p, "ds_swapper", None)
    if swapper is not None:
        swapper.swap_in([p])
    c = p.ds_tensor.numel()
    lo, hi = rank * c, min((rank + 1) * c, p.ds_numel)
    if hi > lo:
        p.ds_tensor[: hi - lo].copy_(p.data.reshape(-1)[lo:hi])
    if swapper is not None:
        swapper.write_resident(p)
        swapper.release([p])


class GatheredParameters:
    """``with GatheredParameters(params, modifier_rank=0):`` read (or, on ``modifier_rank``, modify) full params.

    On exit the modifier rank's values are broadcast and re-partitioned, then the params are released.
    With ``modifier_rank=None`` the params are read-only and changes are discarded.
    """

    def __init__(self, params, modifier_rank: int | None = None, fwd_module=None, enabled: bool = True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in params if is_zero_param(p)]
        self.modifier_rank = modifier_rank
        self.enabled = enabled and bool(self.params)

    def __enter__(self):
        if self.enabled:
            self._was_available = {id(p) for p in self.params if p.ds_status == ZeroParamStatus.AVAILABLE}
            gather_params(self.params)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        if self.modifier_rank is not None:
            for p in self.params:
                # modifier_rank counts within the params' group (DeepSpeed's src_rank = get_global_rank(...)).
                dist.broadcast(p.data, src=_global(p.ds_group, self.modifier_rank), group=p.ds_group)
                repartition_param(p)
                for hook in getattr(p, "ds_on_modified", []):
                    hook(p)
        for p in self.params:
            if id(p) not in self._was_available:
                release_param(p)
        return False


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def default_half_dtype() -> torch.dtype:
    """What DeepSpeed's ``Init._set_dtype`` builds in without a config or dtype: fp16 where the accelerator
    supports it (every CUDA device; on the CPU, where oneDNN has fp16 kernels: AVX512-FP16 / AMX-FP16 parts,
    ``CPU_Accelerator.is_fp16_supported``), else bf16."""
    if torch.cuda.is_available():
        return torch.float16
    try:
        fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        fp16 = False
    return torch.float16 if fp16 else torch.bfloat16


class Init:
    """Construct a model already partitioned: each module's own parameters are split once its ``__init__`` is done.

    As in DeepSpeed, every ``nn.Module`` subclass's ``__init__`` is wrapped while the context is active
    (classes defined inside it too), and a module is partitioned once, after its most derived
    ``__init__`` returns (``_post_init``), so a subclass may still adjust what ``super().__init__`` created.
    ``dtype``: what floating-point parameters are cast to before they are split (None: as built).
    DeepSpeed's full signature is :class:`ds_zero.zero.Init`'s.
    """

    def __init__(self, module=None, data_parallel_group=None, enabled: bool = True, dtype=None):
        if enabled and not dist.is_initialized():
            raise RuntimeError("ds_zero.zero.Init needs torch.distributed to be initialised first")
        self.group = data_parallel_group
        self.enabled = enabled
        self.dtype = dtype
        self._patched: list = []
        if module is not None and enabled:
            for m in module.modules():
                self._partition_module(m)

    def _partition_module(self, module: torch.nn.Module) -> None:
        for p in module.parameters(recurse=False):
            if is_zero_param(p):
                continue
            if self.dtype is not None and p.is_floating_point():
                p.data = p.data.to(self.dtype)
            partition_param(p, self.group)

    def _post_init(self, module: torch.nn.Module) -> None:
        """A module's most derived ``__init__`` returned (DeepSpeed's ``_post_init_method``)."""
        self._partition_module(module)

    def _wrap(self, cls) -> None:
        if "__init__" not in cls.__dict__:
            return
        orig = cls.__dict__["__init__"]
        ctx = self

        @functools.wraps(orig)
        def wrapped(module, *args, **kwargs):
            outermost = not getattr(module, "_ds_init_entered", False)
            if outermost:
                object.__setattr__(module, "_ds_init_entered", True)
            try:
                orig(module, *args, **kwargs)
            finally:
                if outermost:
                    object.__delattr__(module, "_ds_init_entered")
            if outermost:
                ctx._post_init(module)

        cls.__init__ = wrapped
        self._patched.append((cls, "__init__", orig))

    def __enter__(self):
        if not self.enabled:
            return self
        for cls in {torch.nn.Module, *_all_subclasses(torch.nn.Module)}:
            self._wrap(cls)
        ctx = self
        self._orig_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        @classmethod
        def init_subclass(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap(cls)

        torch.nn.Module.__init_subclass__ = init_subclass
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, name, orig in reversed(self._patched):
            setattr(cls, name, orig)
        self._patched.clear()
        if self._orig_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._orig_init_subclass
        return False
