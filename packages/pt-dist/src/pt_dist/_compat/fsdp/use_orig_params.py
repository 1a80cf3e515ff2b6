"""``FullyShardedDataParallel(use_orig_params=True)``: the module keeps its own ``nn.Parameter`` objects, and the
optimizer steps them (torch's ``FlatParamHandle`` with ``use_orig_params``: ``_use_sharded_views``,
``_use_sharded_grad_views``, ``_writeback_orig_params``, ``_deregister_orig_params_ctx``).

``OrigParamsHandle`` is the core ``FlatParamHandle`` (pt_dist/fsdp/flat_param.py) with the original parameters as
views of its flat shard. Each original starts 16-byte aligned in the flat parameter (zeros between, as torch's
``align_addresses``). Outside forward and backward each original's data is the 1-D run of its elements that falls in
this rank's shard (possibly empty), or, unsharded (NO_SHARD), the whole parameter in its own shape; after backward
its ``.grad`` is the same view of the flat gradient (inside ``no_sync()``, sharded: its whole unreduced gradient in
its own shape, a view of the unsharded flat gradient kept there, as torch's). So an optimizer over
``model.parameters()`` steps the flat shard in place, with per-parameter groups (its own learning rate, weight
decay), and a unit may mix frozen and trainable parameters (a frozen one gets no gradient; its part of the flat
gradient stays zero). In forward the module sees plain tensor views of the gathered buffer, as the core's. What the
user does to an original between steps is carried back into the flat parameter: ``p.data = t`` (same shape) at the
next forward, ``p.grad = None`` (``zero_grad``) or ``p.grad = g`` at the next gradient accumulation, as torch's
writeback.
"""

from __future__ import annotations

import contextlib

import torch

from pt_dist.fsdp.flat_param import FlatParamHandle


class OrigParamsHandle(FlatParamHandle):
    """A flat parameter whose original parameters stay the module's, as views of this rank's shard."""

    def __init__(self, named_params, shard_group, replicate_group, sharded: bool, param_dtype, reduce_dtype):
        named_params = list(named_params)
        self.params = list({id(p): p for _, _, _, p in named_params}.values())  # (a tied one once, in order)
        super().__init__(named_params, shard_group, replicate_group, sharded, param_dtype, reduce_dtype)
        self._split, self._split_index, end = [], [], 0  # one split of the flat parameter: gaps and parameters
        for offset, n in zip(self._offsets, self._numels):
            if offset > end:
                self._split.append(offset - end)
            self._split_index.append(len(self._split))
            self._split.append(n)
            end = offset + n
        start = (shard_group.rank() if sharded else 0) * self.shard_numel
        self.runs = []  # per original: (offset in the local shard, elements in it)
        for offset, n in zip(self._offsets, self._numels):
            lo, hi = max(offset, start), min(offset + n, start + self.shard_numel)
            self.runs.append((lo - start, hi - lo) if hi > lo else (0, 0))
        self.shapes = [p.shape for p in self.params]  # (the full shapes: the data becomes 1-D views)
        self._exposed = False  # the flat parameter registered for nn.Module._apply (flat_params_exposed)
        self.use_sharded_views()

    # -- the core handle's steps, with the originals kept as views ------------------------------------------------

    @staticmethod
    def _flat_requires_grad(named_params, uniques) -> bool:
        """Trainable if any original is (a frozen one gets no gradient, and no part of the flat one)."""
        return any(p.requires_grad for p in uniques)

    @staticmethod
    def _flat_offsets(uniques) -> list[int]:
        """Each parameter starts 16-byte aligned (zeros between), as torch's ``align_addresses``."""
        align, offsets, total = 16 // uniques[0].dtype.itemsize, [], 0
        for p in uniques:
            total += (-total) % align
            offsets.append(total)
            total += p.numel()
        return offsets

    def views_of(self, flat: torch.Tensor) -> list:
        pieces = (flat if flat.numel() == self.numel else flat.narrow(0, 0, self.numel)).split(self._split)
        return [pieces[j] for j in self._split_index]

    def managed_params(self) -> tuple:
        return (self.flat_param, *self.params)

    def _setattr_views(self, views: list) -> None:
        self.unregister()  # forward's plain views go where the originals were
        super()._setattr_views([v if p.requires_grad else v.detach() for v, p in zip(views, self.params)])

    def reshard(self) -> None:
        super().reshard()
        self.use_sharded_views()

    def _accumulate_grad(self, grad: torch.Tensor) -> None:
        self.writeback_grads()  # zero_grad() and the like reached the originals' gradients only
        super()._accumulate_grad(grad)
        self.use_grad_views()

    def keep_unsharded_grad(self) -> None:
        self._writeback_before_accumulating()
        super().keep_unsharded_grad()
        if self.sharded:
            self.use_unsharded_grad_views()

    def reduce_grad(self, world: int) -> None:
        self._writeback_before_accumulating()
        super().reduce_grad(world)
        if self.sharded:  # the unsharded gradient is in the reduction: the originals see the shard again
            self.use_grad_views()

    def _writeback_before_accumulating(self) -> None:
        """What the user did to the originals' gradients, carried into the flat one before a gradient joins it;
        over the unsharded gradient ``no_sync()`` kept, a ``zero_grad()`` drops it (torch's
        ``_reset_flat_param_grad_info_if_needed``)."""
        if not (self._kept and self.sharded):
            self.writeback_grads()
        elif all(p.grad is None for p in self.params):
            self.flat_param.grad = None

    # -- the views ------------------------------------------------------------------------------------------------

    def shard_view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """The ``i``-th original's part of a local flat shard (``flat_param`` or its gradient)."""
        if not self.sharded:
            return flat.narrow(0, self._offsets[i], self.shapes[i].numel()).view(self.shapes[i])
        lo, n = self.runs[i]
        return flat.narrow(0, lo, n)

    def in_shard(self, i: int) -> bool:
        return not self.sharded or self.runs[i][1] > 0

    def register(self) -> None:
        """The originals back on their modules (forward left plain tensor views there)."""
        for info, piece in zip(self.infos, self._piece_of):
            info.module.__dict__.pop(info.name, None)
            info.module._parameters[info.name] = self.params[piece]

    def unregister(self) -> None:
        """Off their modules, for forward's plain views (``setattr`` of a tensor over a registered parameter is
        refused by ``nn.Module``)."""
        for info in self.infos:
            info.module._parameters.pop(info.name, None)

    def use_sharded_views(self) -> None:
        flat = self.flat_param.detach()
        for i, p in enumerate(self.params):
            p.data = self.shard_view(flat, i)
        self.register()

    def use_full_views(self, full: torch.Tensor) -> None:
        """Inside ``summon_full_params``: each original is the whole parameter, a view of the gathered ``full``."""
        for p, view, shape in zip(self.params, self.views_of(full), self.shapes):
            p.data = view.view(shape)
        self.register()

    def use_grad_views(self) -> None:
        """Each trainable original's gradient, a view of the flat gradient; None for one with no elements here."""
        fp = self.flat_param
        for i, p in enumerate(self.params):
            here = p.requires_grad and fp.grad is not None and self.in_shard(i)
            p.grad = self.shard_view(fp.grad, i) if here else None  # (none outside the shard, as torch's)

    def use_unsharded_grad_views(self) -> None:
        """Inside ``no_sync()`` (sharded): each original's gradient is its whole, unreduced gradient in its own shape,
        a view of the unsharded flat gradient, set through ``.data`` on the sharded parameter (torch's
        ``_use_unsharded_grad_views``)."""
        grad = self.flat_param.grad
        views = self.views_of(grad) if grad is not None else [None] * len(self.params)
        for p, view, shape in zip(self.params, views, self.shapes):
            if view is None:
                p.grad = None
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.data = view.view(shape)

    # -- writeback (torch's _writeback_orig_params) ---------------------------------------------------------------

    def writeback_params(self) -> None:
        """An original whose data the user replaced (``p.data = t``) has it copied into the flat shard."""
        flat = self.flat_param.detach()
        for i, p in enumerate(self.params):
            view = self.shard_view(flat, i)
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
        fp = self.flat_param
        here = [i for i in range(len(self.params)) if self.in_shard(i)]
        if all(self.params[i].grad is None for i in here):
            fp.grad = None
            return
        if fp.grad is None:
            fp.grad = torch.zeros_like(fp)
        for i in here:
            p, view = self.params[i], self.shard_view(fp.grad, i)
            if p.grad is None or not p.requires_grad:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr() and view.numel():
                view.copy_(p.grad)

    def full_grads(self) -> torch.Tensor | None:
        """Inside ``summon_full_params(with_grads=True)``: the whole unpadded flat gradient (collective over the
        shard group), None when every rank's is None; a rank without one contributes zeros, as torch's."""
        fp = self.flat_param
        self.writeback_grads()
        if not (self.sharded and self.shard_group.size() > 1):
            return None if fp.grad is None else fp.grad.reshape(-1).narrow(0, 0, self.numel)
        nones = torch.tensor([int(fp.grad is None)], dtype=torch.int32, device=self.device)
        self.shard_group.all_reduce(nones).wait()
        if int(nones[0]) == self.shard_group.size():
            return None
        local = fp.grad if fp.grad is not None else torch.zeros_like(fp)
        full = torch.empty(self.padded_numel, dtype=local.dtype, device=self.device)
        self.shard_group.all_gather_into_tensor(full, local.detach().contiguous()).wait()
        return full.narrow(0, 0, self.numel)

    def _name(self, i: int) -> str:
        return next(info.fqn for info, piece in zip(self.infos, self._piece_of) if piece == i)


def orig_handles(units) -> list:
    """The ``use_orig_params`` handles of ``units``."""
    return [u._handle for u in units if isinstance(u._handle, OrigParamsHandle)]


@contextlib.contextmanager
def flat_params_exposed(units):
    """For ``nn.Module._apply`` (``model.half()``, ``.to()``): each unit's flat parameter registered in place of its
    originals, so the conversion reaches the flat shard and the originals are its views again after (torch's
    ``_deregister_orig_params_ctx``)."""
    handles = [h for h in orig_handles(units) if not h._exposed]
    for h in handles:
        h._exposed = True
        h.unregister()
        h.owner._parameters["_flat_param"] = h.flat_param
    try:
        yield
    finally:
        for h in handles:
            h.owner._parameters.pop("_flat_param", None)
            h.use_sharded_views()
            h.use_grad_views()
            h._exposed = False
