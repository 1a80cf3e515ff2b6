"""ZeRO stage 3 (Rajbhandari et al., 2020, section 5.3, P_os+g+p), DeepSpeed's ``DeepSpeedZeroOptimizer_Stage3``.

Parameters live partitioned (:mod:`partition_parameters`). Module hooks make them whole only while
needed: a forward pre-hook gathers a module's own parameters (the coordinator prefetches the next
ones, :mod:`partitioned_param_coordinator`), a forward post-hook releases them unless the step's trace
uses them again within ``stage3_max_reuse_distance``, and wraps the outputs (tensors anywhere in
tuples, lists, dicts) so that backward gathers them, if released, before the module's gradient is
computed. Each gradient is reduce-scattered as soon as autograd accumulates it and the
parameter is released. Parameters of at most ``stage3_param_persistence_threshold`` elements stay
gathered for good. With ``offload_param`` the partitions live in host memory (or on NVMe,
:mod:`ds_zero.runtime.swap_tensor`) and are fetched just before they are gathered.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ds_zero.runtime.zero.base_optimizer import ZeroOptimizerBase
from ds_zero.runtime.zero.partition_parameters import (
    ZeroParamStatus,
    chunk_numel,
    gather_params,
    is_zero_param,
    partition_param,
    release_param,
)
from ds_zero.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
from ds_zero.runtime.zero.reduce_scatter import GradientBucketReducer


class _PreBackward(torch.autograd.Function):
    """Identity on a module's outputs whose backward gathers the module's params first (DeepSpeed's
    ``PreBackwardFunctionForModule``; every module gets one, so the trace's backward part is DeepSpeed's)."""

    @staticmethod
    def forward(ctx, coordinator, module, *outputs):
        ctx.coordinator, ctx.module = coordinator, module
        # Detached aliases, not views: autograd makes this node their producer, and the caller may still
        # modify them in place (a view made inside a custom Function may not be).
        outs = tuple(o.detach() for o in outputs)
        return outs[0] if len(outs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads):
        ctx.coordinator.fetch_sub_module(ctx.module, "bwd")
        return (None, None, *grads)


def wrap_outputs(coordinator, module, output):
    """Route every grad-requiring tensor of ``output`` (any nesting of tuples/lists/dicts) through one
    ``_PreBackward`` node, keeping the container types."""
    leaves, spec = pytree.tree_flatten(output)
    idx = [i for i, o in enumerate(leaves) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not idx:
        return output
    wrapped = _PreBackward.apply(coordinator, module, *[leaves[i] for i in idx])
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    for i, w in zip(idx, wrapped):
        leaves[i] = w
    return pytree.tree_unflatten(leaves, spec)


class DeepSpeedZeroOptimizer_Stage3(ZeroOptimizerBase):  # noqa: N801 - DeepSpeed's class name
    def __init__(self, module: torch.nn.Module, init_optimizer, loss_scaler, clip_grad: float = 0.0,
                 groups=None, reduce_bucket_size: int = 500_000_000, overlap_comm: bool = False,
                 prefetch_bucket_size: int = 50_000_000, param_persistence_threshold: int = 100_000,
                 max_live_parameters: int = 1_000_000_000, max_reuse_distance: int = 1_000_000_000,
                 offload_optimizer=None, offload_param=None, device=None, compute_dtype=None,
                 sub_group_size: int = 1_000_000_000, nvme=None):
        super().__init__(init_optimizer, loss_scaler, clip_grad, groups, partitioned=True,
                         offload_optimizer=offload_optimizer, device=device)
        self.module = module
        self.offload_param = offload_param is not None and offload_param.enabled
        optimizer_on_nvme = offload_optimizer is not None and offload_optimizer.device == "nvme"
        self.fp16_groups: list[list[torch.nn.Parameter]] = []
        self.flat_partitions: list[torch.Tensor] = []  # low-precision, this rank's chunks back to back
        self.grad_partitions: list[torch.Tensor] = []
        self._grad_pieces = {}
        self._hooks = []
        dtype = compute_dtype
        for group in init_optimizer.param_groups:
            # An empty group (only frozen params, or none yet) keeps its place with no elements.
            params = [p for p in group["params"] if p.requires_grad]
            for p in params:
                if not is_zero_param(p):
                    partition_param(p, self.dp_process_group)
            gdtype = dtype or (params[0].ds_tensor.dtype if params else torch.float32)
            total = sum(p.ds_tensor.numel() for p in params)
            if self.offload_param and offload_param.device == "cpu":
                flat = self.host.zeros(total, gdtype, "parameters")
            else:
                flat = torch.zeros(total, dtype=gdtype, device=self.device)
            off, ranges = 0, []
            for p in params:
                c = p.ds_tensor.numel()
                flat[off:off + c].copy_(p.ds_tensor)
                p.ds_tensor = flat[off:off + c]
                if p.data.dtype != gdtype:
                    p.data = p.data.to(gdtype)
                # Every rank owns chunk r of every param, so the bucket splits evenly: one reduce_scatter.
                self._grad_pieces[p] = (len(self.fp16_groups),
                                        [(r, r * c, (r + 1) * c, off) for r in range(self.world_size)])
                ranges.append((p, off, off + c))
                off += c
                p.ds_persist = p.ds_numel <= param_persistence_threshold
            self._norm_runs.append(self._set_norm_runs(ranges))
            self.fp16_groups.append(params)
            self.flat_partitions.append(flat)
            if not self.offload:
                self.grad_partitions.append(torch.zeros(total, dtype=gdtype, device=self.device))
            if optimizer_on_nvme:  # the masters and moments go to NVMe (ZeroInfinity); only grads stay in host memory
                self.fp32_grads.append(self.host.zeros(total, torch.float32, "gradients"))
            else:
                self.master_partitions.append(self._new_master(flat))
        self.nvme = nvme(self) if nvme is not None else None  # ZeRO-Infinity swappers, built on this optimizer
        self.coordinator = PartitionedParameterCoordinator(
            prefetch_bucket_size, max_live_parameters, max_reuse_distance,
            swapper=self.nvme.param_swapper if self.nvme is not None else None)
        for params in self.fp16_groups:
            self.coordinator.all_params.extend(params)
        self.optimizer = self._wrap_optimizer(init_optimizer)
        self.reducer = GradientBucketReducer(self.grad_partitions, reduce_bucket_size,
                                             self.flat_partitions[0].dtype if self.flat_partitions else torch.float32,
                                             overlap_comm, self.dp_process_group,
                                             deliver=self._offload_piece if self.offload else None)
        for p in self._grad_pieces:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self._register_module_hooks(module)
        self._gather_persistent()

    def _register_module_hooks(self, module: torch.nn.Module) -> None:
        coord = self.coordinator

        def pre_forward(mod, args):
            coord.fetch_sub_module(mod, "fwd")

        def post_forward(mod, args, output):
            # A module may hand its own parameter to its caller (DeepSpeed's "external parameter"): keep that one
            # whole; its gradient hook releases it.
            returned = {id(t) for t in pytree.tree_leaves(output) if isinstance(t, torch.nn.Parameter)}
            coord.release_sub_module(mod, "fwd", keep_ids=returned)
            if not torch.is_grad_enabled():
                return output
            return wrap_outputs(coord, mod, output)

        for m in module.modules():
            self._hooks.append(m.register_forward_pre_hook(pre_forward))
            self._hooks.append(m.register_forward_hook(post_forward))

    def _grad_ready(self, p: torch.nn.Parameter) -> None:
        gi, pieces = self._grad_pieces[p]
        self.reducer.add(p.grad, pieces, gi)
        p.grad = None
        release_param(p)

    def _offload_piece(self, pidx: int, off: int, reduced: torch.Tensor) -> None:
        self.grad_offloader.submit(self.fp32_grads[pidx][off:off + reduced.numel()], reduced, accumulate=True)

    def _gather_persistent(self) -> None:
        persistent = [p for ps in self.fp16_groups for p in ps if p.ds_persist]
        for p in persistent:
            if p.ds_status == ZeroParamStatus.AVAILABLE:
                p.ds_persist = False
                release_param(p)
                p.ds_persist = True
        gather_params(persistent)

    def backward_prologue(self, is_boundary: bool) -> None:
        self.coordinator.begin_phase("bwd")

    def post_backward(self, is_boundary: bool) -> None:
        self.reducer.finish()
        self.coordinator.end_phase("bwd")

    def reduced_grad_partitions(self) -> list[torch.Tensor]:
        return self.fp32_grads if self.offload else self.grad_partitions

    def lowp_partitions(self) -> list[torch.Tensor]:
        return self.flat_partitions

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.grad_partitions + self.fp32_grads:
            g.zero_()

    def _run_optimizer(self) -> None:
        if self.nvme is not None:
            self.nvme.step()
        else:
            super()._run_optimizer()

    def _after_write_back(self) -> None:
        self._gather_persistent()

    def _update_params_from_master(self) -> None:
        if self.nvme is None:
            return super()._update_params_from_master()
        masters, states = self.nvme.read_state()
        self.nvme.write_state(masters, states)  # writes the parameter files from the masters when they are on NVMe
        if self.nvme.param_swapper is None:
            for flat, m in zip(self.flat_partitions, masters):
                flat.copy_(m)
        self._gather_persistent()

    def state_dict(self) -> dict:
        if self.nvme is None:
            return super().state_dict()
        masters, states = self.nvme.read_state()  # one consistent copy of what lives in the swap files
        return {"optimizer_state_dict": self.optimizer.state_dict(), "master_partitions": masters,
                "nvme_states": states, "loss_scaler": self.loss_scaler.state_dict(), "world_size": self.world_size,
                "rank": self.rank}

    def load_state_dict(self, sd: dict) -> None:
        if self.nvme is None:
            return super().load_state_dict(sd)
        if sd["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was saved with data-parallel world size {sd['world_size']}, "
                             f"this run has {self.world_size}; consolidate it with zero_to_fp32 instead")
        self.optimizer.load_state_dict(sd["optimizer_state_dict"])
        self.loss_scaler.load_state_dict(sd["loss_scaler"])
        self.nvme.write_state(sd["master_partitions"], sd.get("nvme_states"))
        if self.nvme.param_swapper is None:
            for flat, m in zip(self.flat_partitions, sd["master_partitions"]):
                flat.copy_(m)
        self._gather_persistent()

    def _load_masters(self, saved) -> None:
        if self.nvme is None:
            return super()._load_masters(saved)
        self.nvme.write_state(saved, None)

    def layout(self) -> dict:
        return {"kind": "chunked", "partition_count": self.world_size,
                "numels": [[p.ds_numel for p in ps] for ps in self.fp16_groups],
                "chunks": [[chunk_numel(p.ds_numel, self.world_size) for p in ps] for ps in self.fp16_groups]}

    @property
    def trainable_param_groups(self) -> list[list[torch.nn.Parameter]]:
        return self.fp16_groups

    def destroy(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.nvme is not None:
            self.nvme.close()
        self.close()
