"""An instrumented process group: every collective and point-to-point call a strategy makes is recorded with its
payload and the time the rank spent blocked in it.

torch-based code (ds-zero, mega-par, DeepSpeed, torch's FSDP2, torch DDP through torch's own ``allreduce_hook``)
calls ``torch.distributed.<op>`` at call time, so the counter wraps those functions for the duration of a
``with counter:`` block; pt-dist's groups are wrapped per instance (:meth:`CommCounter.wrap_pt_dist`). Nested calls
(an op built from another) count once, at the outermost call.

The volume of each op is counted the way the ZeRO paper (Rajbhandari et al. 2020, section 7) counts it: an
all-reduce of M bytes moves 2M (reduce-scatter then all-gather), an all-gather or a reduce-scatter moves the full
M, a broadcast or a send moves M. A ring sends (N-1)/N of that volume per rank (``wire_bytes``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

# op name -> (which argument holds the full payload, volume factor)
_TORCH_OPS = {
    "all_reduce": ("tensor", 2),
    "broadcast": ("tensor", 1),
    "reduce": ("tensor", 1),
    "all_gather": ("gathered", 1),
    "all_gather_into_tensor": ("output", 1),
    "all_gather_single": ("output", 1),
    "reduce_scatter": ("scattered", 1),
    "reduce_scatter_tensor": ("input", 1),
    "reduce_scatter_single": ("input", 1),
    "all_to_all_single": ("input", 1),
    "send": ("tensor", 1),
    "isend": ("tensor", 1),
    "batch_isend_irecv": ("p2p", 1),
    "recv": ("none", 0),
    "irecv": ("none", 0),
    "barrier": ("none", 0),
}


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _payload(op: str, args: tuple, kwargs: dict) -> int:
    """Bytes of the full tensor the op moves (the gathered / reduced size, not one rank's shard)."""
    where = _TORCH_OPS[op][0]
    if where == "none":
        return 0
    if where == "p2p":  # a list of P2POp: the sends count
        ops = args[0] if args else kwargs.get("p2p_op_list", [])
        return sum(_nbytes(p.tensor) for p in ops if getattr(p.op, "__name__", "") in ("isend", "send"))
    if where == "gathered":  # all_gather(tensor_list, tensor)
        lst = args[0] if args else kwargs.get("tensor_list", [])
        return sum(_nbytes(t) for t in lst)
    if where == "scattered":  # reduce_scatter(output, input_list)
        lst = args[1] if len(args) > 1 else kwargs.get("input_list", [])
        return sum(_nbytes(t) for t in lst)
    names = {"tensor": ("tensor",), "output": ("output_tensor", "output"), "input": ("input_tensor", "input")}[where]
    position = {"tensor": 0, "output": 0, "input": 1}[where]
    for name in names:
        if name in kwargs:
            return _nbytes(kwargs[name])
    return _nbytes(args[position]) if len(args) > position else 0


@dataclass
class CommRecord:
    calls: int = 0
    payload_bytes: int = 0
    volume_bytes: int = 0
    wire_bytes: float = 0.0
    sizes: dict = field(default_factory=dict)  # payload bytes -> calls


@dataclass
class CommCounter:
    """Counts per op name; ``seconds`` is the time spent inside blocking calls and ``Work.wait``."""

    world_size: int
    ops: dict = field(default_factory=lambda: defaultdict(CommRecord))
    seconds: float = 0.0
    enabled: bool = True
    _local: threading.local = field(default_factory=threading.local)
    _saved: list = field(default_factory=list)

    def record(self, op: str, payload: int, factor: int, group_size: int) -> None:
        if not self.enabled:
            return
        r = self.ops[op]
        r.calls += 1
        r.payload_bytes += payload
        r.volume_bytes += factor * payload
        n = max(1, group_size)
        r.wire_bytes += factor * payload * (n - 1) / n
        r.sizes[payload] = r.sizes.get(payload, 0) + 1

    def reset(self) -> None:
        self.ops.clear()
        self.seconds = 0.0

    def totals(self) -> dict:
        skip = ("barrier",)
        return {
            "collectives": sum(r.calls for k, r in self.ops.items() if k not in skip),
            "volume_bytes": sum(r.volume_bytes for r in self.ops.values()),
            "wire_bytes": sum(r.wire_bytes for r in self.ops.values()),
            "by_op": {k: {**vars(r), "sizes": dict(r.sizes)} for k, r in sorted(self.ops.items())},
        }

    # --- wrapping ---------------------------------------------------------------------------------------------
    def _timed(self, fn, op: str, factor: int, group_size_of):
        counter = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(counter._local, "depth", 0):
                return fn(*args, **kwargs)
            counter._local.depth = 1
            t0 = time.perf_counter()
            try:
                counter.record(op, _payload(op, args, kwargs), factor, group_size_of(args, kwargs))
                return fn(*args, **kwargs)
            finally:
                counter._local.depth = 0
                if counter.enabled:
                    counter.seconds += time.perf_counter() - t0

        return wrapper

    def _wrap_wait(self, cls) -> None:
        counter, real = self, cls.wait

        def wait(work, *args, **kwargs):
            if getattr(counter._local, "depth", 0):  # a blocking op waiting on its own work: timed by the op
                return real(work, *args, **kwargs)
            t0 = time.perf_counter()
            try:
                return real(work, *args, **kwargs)
            finally:
                if counter.enabled:
                    counter.seconds += time.perf_counter() - t0

        self._saved.append((cls, "wait", real))
        cls.wait = wait

    def __enter__(self) -> CommCounter:
        import torch.distributed as dist

        def group_size(args, kwargs):
            group = kwargs.get("group")
            try:
                return dist.get_world_size(group) if dist.is_initialized() else 1
            except (ValueError, RuntimeError):
                return 1

        c10d = dist.distributed_c10d
        for op, (_, factor) in _TORCH_OPS.items():
            if hasattr(dist, op):
                real = getattr(dist, op)
                wrapped = self._timed(real, op, factor, group_size)
                # both names: P2POp checks its op against distributed_c10d's isend / irecv
                for module in (dist, c10d):
                    if getattr(module, op, None) is real:
                        self._saved.append((module, op, real))
                        setattr(module, op, wrapped)
        self._wrap_wait(dist.distributed_c10d.Work)
        return self

    def __exit__(self, *exc) -> None:
        while self._saved:
            owner, name, real = self._saved.pop()
            if real is None:  # an instance attribute shadowing the class's method
                delattr(owner, name)
            else:
                setattr(owner, name, real)

    def wrap_pt_dist(self, group):
        """Instrument a pt-dist ProcessGroup instance in place (its collectives shadowed on the instance)."""
        names = {"all_reduce": 2, "broadcast": 1, "reduce": 1, "all_gather_into_tensor": 1, "all_gather": 1,
                 "reduce_scatter_tensor": 1, "all_to_all_single": 1, "send": 1, "recv": 0, "barrier": 0}
        size = group.size()
        for op, factor in names.items():  # pt-dist's signatures follow torch's: (tensor, ...), (output, input, ...)
            self._saved.append((group, op, None))
            setattr(group, op, self._timed(getattr(group, op), op, factor, lambda a, k: size))
        from pt_dist.work import Work

        if not any(owner is Work for owner, _, _ in self._saved):
            self._wrap_wait(Work)
        return group
