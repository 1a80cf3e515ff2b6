"""Memory per rank by kind, measured by summing tensor bytes (never process RSS).

``tensor_bytes`` counts each byte of a storage once (views into one flat buffer are not counted twice).
``ActivationMeter`` tracks the tensors autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``)
while they are alive, and keeps the peak: with 1F1B several micro-batches' activations are alive at once and the
meter sees it. Parameters and views of them (leaves that require grad) are not
activations; inputs are.
"""

from __future__ import annotations

import torch

KINDS = ("parameters", "gradients", "optimizer_states", "activations")


def tensor_bytes(tensors) -> int:
    """Bytes of memory the tensors reference: per storage, the union of their byte ranges (a flat buffer and the
    views into it count once)."""
    ranges: dict = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
            continue
        start = t.storage_offset() * t.element_size()
        ranges.setdefault(t.untyped_storage().data_ptr(), []).append((start, start + t.numel() * t.element_size()))
    total = 0
    for spans in ranges.values():
        end = -1
        for lo, hi in sorted(spans):
            if hi > end:
                total += hi - max(lo, end)
                end = hi
    return total


def optimizer_state_tensors(optimizer) -> list:
    """Every tensor in a ``torch.optim`` optimizer's state (exp_avg, exp_avg_sq, step when it is a tensor)."""
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


class _Saved:
    """What the pack hook returns: holds the tensor, and releases its storage's bytes when autograd drops it."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor, key, meter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        self.meter._release(self.key)


class ActivationMeter:
    """``with meter:`` around forward and backward; ``meter.peak`` is the most saved-activation bytes alive at once.

    A storage saved by several ops (the input of the q, k and v projections) counts once while any of them holds it.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._refs: dict = {}
        self._ctx = None

    @staticmethod
    def _is_parameter(t: torch.Tensor) -> bool:
        """A parameter, or a view of one (Linear saves ``weight.t()``): counted as a parameter."""
        base = t if t._base is None else t._base
        return base.is_leaf and base.requires_grad

    def _pack(self, t: torch.Tensor):
        if self._is_parameter(t):
            return t
        key = (t.untyped_storage().data_ptr(), t.dtype)
        count, nbytes = self._refs.get(key, (0, t.untyped_storage().nbytes()))
        self._refs[key] = (count + 1, nbytes)
        if count == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        return _Saved(t, key, self)

    @staticmethod
    def _unpack(packed):
        return packed if isinstance(packed, torch.Tensor) else packed.tensor

    def _release(self, key) -> None:
        count, nbytes = self._refs[key]
        if count == 1:
            del self._refs[key]
            self.live -= nbytes
        else:
            self._refs[key] = (count - 1, nbytes)

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        self._ctx = None
