"""``use_orig_params=True``: the module keeps its own ``nn.Parameter`` objects, and the optimizer steps them
(torch's ``FlatParamHandle._use_sharded_views`` / ``_use_sharded_grad_views`` / ``_writeback_orig_params``).

Outside forward and backward each original parameter's data is a view of this rank's flat shard: the 1-D run of
its elements that falls in the shard (possibly empty), or, unsharded (NO_SHARD), the whole parameter in its own
shape; after backward its ``.grad`` is the same view of the flat gradient. So an optimizer over
``model.parameters()`` steps the flat shard in place, with per-parameter groups (its own learning rate, weight
decay), and a unit may mix frozen and trainable parameters (a frozen one gets no gradient; its part of the flat
gradient stays zero). In forward the module sees plain tensor views of the gathered buffer, as without
``use_orig_params``. What the user does to an original between steps is carried back into the flat parameter:
``p.data = t`` (same shape) at the next forward, ``p.grad = None`` (``zero_grad``) or ``p.grad = g`` at the
next gradient accumulation, as torch's writeback.
"""

from __future__ import annotations

import contextlib

import torch


class OrigParams:
    """The original parameters of one ``FlatParamHandle`` and the views that tie them to its flat shard."""

    def __init__(self, handle, uniques: list):
        self.handle, self.params = handle, uniques
        start = (handle.shard_group.rank() if handle.sharded else 0) * handle.shard_numel
        self.views = []  # per original: (offset in the local shard, elements in it)
        for p, offset in zip(uniques, handle._offsets):
            lo, hi = max(offset, start), min(offset + p.numel(), start + handle.shard_numel)
            self.views.append((lo - start, hi - lo) if hi > lo else (0, 0))
        self.shapes = [p.shape for p in uniques]  # (the full shapes: the data becomes 1-D views)

    def _view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        if not self.handle.sharded:
            return flat.narrow(0, self.handle._offsets[i], self.shapes[i].numel()).view(self.shapes[i])
        lo, n = self.views[i]
        return flat.narrow(0, lo, n)

    def register(self) -> None:
        """The originals back on their modules (forward left plain tensor views there)."""
        h = self.handle
        for info, piece in zip(h.infos, h._piece_of):
            info.module.__dict__.pop(info.name, None)
            info.module._parameters[info.name] = self.params[piece]

    def unregister(self) -> None:
        """Off their modules, for forward's plain views (``setattr`` of a tensor over a registered parameter is
        refused by ``nn.Module``)."""
        for info in self.handle.infos:
            info.module._parameters.pop(info.name, None)

    def use_sharded_views(self) -> None:
        flat = self.handle.flat_param.detach()
        for i, p in enumerate(self.params):
            p.data = self._view(flat, i)
        self.register()

    def use_full_views(self, full: torch.Tensor) -> None:
        """Inside ``summon_full_params``: each original is the whole parameter, a view of the gathered ``full``."""
        for p, view, shape in zip(self.params, self.handle.views_of(full), self.shapes):
            p.data = view.view(shape)
        self.register()

    # -- writeback (torch's _writeback_orig_params) ---------------------------------------------------------------

    def writeback_params(self) -> None:
        """An original whose data the user replaced (``p.data = t``) has it copied into the flat shard."""
        flat = self.handle.flat_param.detach()
        for i, p in enumerate(self.params):
            view = self._view(flat, i)
            if p.data.data_ptr() == view.data_ptr() or view.numel() == 0:
                continue
            if p.shape != view.shape or p.dtype != view.dtype:
                raise RuntimeError(
                    f"FullyShardedDataParallel(use_orig_params=True): the original parameter "
                    f"{self._name(i)!r} was changed to shape {tuple(p.shape)} / {p.dtype}; its sharded form is "
                    f"{tuple(view.shape)} / {view.dtype} (only the values may change)"
                )
            with torch.no_grad():
                view.copy_(p.data)
            p.data = view

    def writeback_grads(self) -> None:
        """The flat gradient as the originals' gradients say: all None (``zero_grad()``) -> None; one None (or
        frozen since) -> its part zeroed; one replaced -> copied in."""
        fp = self.handle.flat_param
        here = [i for i in range(len(self.params)) if self._in_shard(i)]
        if all(self.params[i].grad is None for i in here):
            fp.grad = None
            return
        if fp.grad is None:
            fp.grad = torch.zeros_like(fp)
        for i in here:
            p, view = self.params[i], self._view(fp.grad, i)
            if p.grad is None or not p.requires_grad:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr() and view.numel():
                view.copy_(p.grad)

    def use_grad_views(self) -> None:
        """Each trainable original's gradient, a view of the flat gradient; None for one with no elements here."""
        fp = self.handle.flat_param
        for i, p in enumerate(self.params):
            in_shard = p.requires_grad and fp.grad is not None and self._in_shard(i)
            p.grad = self._view(fp.grad, i) if in_shard else None  # (none outside the shard, as torch's)

    def _in_shard(self, i: int) -> bool:
        return not self.handle.sharded or self.views[i][1] > 0

    def full_grads(self) -> torch.Tensor | None:
        """Inside ``summon_full_params(with_grads=True)``: the whole unpadded flat gradient (collective over the
        shard group), None when every rank's is None; a rank without one contributes zeros, as torch's."""
        h, fp = self.handle, self.handle.flat_param
        self.writeback_grads()
        if not (h.sharded and h.shard_group.size() > 1):
            return None if fp.grad is None else fp.grad.reshape(-1).narrow(0, 0, h.numel)
        nones = torch.tensor([int(fp.grad is None)], dtype=torch.int32, device=h.device)
        h.shard_group.all_reduce(nones).wait()
        if int(nones[0]) == h.shard_group.size():
            return None
        local = fp.grad if fp.grad is not None else torch.zeros_like(fp)
        full = torch.empty(h.padded_numel, dtype=local.dtype, device=h.device)
        h.shard_group.all_gather_into_tensor(full, local.detach().contiguous()).wait()
        return full.narrow(0, 0, h.numel)

    def _name(self, i: int) -> str:
        h = self.handle
        return next(info.fqn for info, piece in zip(h.infos, h._piece_of) if piece == i)


@contextlib.contextmanager
def flat_params_exposed(units):
    """For ``nn.Module._apply`` (``model.half()``, ``.to()``): each unit's flat parameter registered in place of its
    originals, so the conversion reaches the flat shard and the originals are its views again after (torch's
    ``_deregister_orig_params_ctx``)."""
    handles = [u._handle for u in units if u._handle is not None and u._handle.orig is not None
               and not u._handle._exposed]
    for h in handles:
        h._exposed = True
        h.orig.unregister()
        h.owner._parameters["_flat_param"] = h.flat_param
    try:
        yield
    finally:
        for h in handles:
            h.owner._parameters.pop("_flat_param", None)
            h.orig.use_sharded_views()
            h.orig.use_grad_views()
            h._exposed = False
