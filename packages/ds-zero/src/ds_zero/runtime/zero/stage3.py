"""ZeRO stage 3 (Rajbhandari et al., 2020, section 5.3, P_os+g+p), DeepSpeed's ``DeepSpeedZeroOptimizer_Stage3``.

Parameters live partitioned (:mod:`partition_parameters`). Module hooks make them whole only while
needed: a forward pre-hook gathers a module's own parameters (and prefetches the next modules' by
the order recorded on the first pass, up to ``stage3_prefetch_bucket_size`` elements, never more than
``stage3_max_live_parameters`` live), a forward post-hook releases them and wraps the outputs so that
backward gathers them again before the module's gradient is computed. Each gradient is
reduce-scattered as soon as autograd accumulates it and the parameter is released. Parameters of at
most ``stage3_param_persistence_threshold`` elements stay gathered for good (the all-gather latency
would cost more than their memory).
"""

from __future__ import annotations

import torch

from ds_zero.runtime.zero.base_optimizer import ZeroOptimizerBase
from ds_zero.runtime.zero.partition_parameters import (
    ZeroParamStatus,
    gather_params,
    is_zero_param,
    partition_param,
    release_param,
)
from ds_zero.runtime.zero.reduce_scatter import GradientBucketReducer


class _PreBackward(torch.autograd.Function):
    """Identity on a module's outputs whose backward gathers the module's params first."""

    @staticmethod
    def forward(ctx, coordinator, module, *outputs):
        ctx.coordinator, ctx.module = coordinator, module
        # Fresh views, so autograd records this node as their producer.
        outs = tuple(o.view_as(o) for o in outputs)
        return outs[0] if len(outs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads):
        ctx.coordinator.fetch_sub_module(ctx.module, "bwd")
        return (None, None, *grads)


class PartitionedParameterCoordinator:
    """Gathers, prefetches and releases parameters around each submodule (DeepSpeed's coordinator)."""

    def __init__(self, prefetch_bucket_size: int, max_live_parameters: int):
        self.prefetch_bucket_size = int(prefetch_bucket_size)
        self.max_live_parameters = int(max_live_parameters)
        self.trace = {"fwd": [], "bwd": []}
        self.trace_complete = False
        self.position = {"fwd": 0, "bwd": 0}
        self.inflight: dict[int, object] = {}  # param ds_id -> AllGatherHandle
        self.all_params: list[torch.nn.Parameter] = []

    @staticmethod
    def _own(module) -> list:
        return [p for p in module.parameters(recurse=False) if is_zero_param(p)]

    def live_numel(self) -> int:
        return sum(p.ds_numel for p in self.all_params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)

    def fetch_sub_module(self, module, phase: str) -> None:
        params = self._own(module)
        for p in params:
            handle = self.inflight.pop(p.ds_id, None)
            if handle is not None:
                handle.wait()
                for q in list(self.inflight):
                    if self.inflight[q] is handle:
                        del self.inflight[q]
        gather_params(params)
        if not self.trace_complete:
            self.trace[phase].append(module)
        else:
            self._prefetch(module, phase)

    def _prefetch(self, module, phase: str) -> None:
        trace = self.trace[phase]
        pos = self.position[phase]
        if pos >= len(trace) or trace[pos] is not module:
            return  # the order changed; fall back to on-demand gathers for this pass
        self.position[phase] = pos + 1
        budget, live, todo = self.prefetch_bucket_size, self.live_numel(), []
        for nxt in trace[pos + 1:]:
            for p in self._own(nxt):
                if p.ds_status != ZeroParamStatus.NOT_AVAILABLE or any(p is q for q in todo):
                    continue
                if p.ds_numel > budget or live + p.ds_numel > self.max_live_parameters:
                    budget = -1
                    break
                todo.append(p)
                budget -= p.ds_numel
                live += p.ds_numel
            if budget <= 0:
                break
        if todo:
            handle = gather_params(todo, async_op=True)
            for p in todo:
                self.inflight[p.ds_id] = handle

    def release_sub_module(self, module) -> None:
        for p in self._own(module):
            if p.ds_id not in self.inflight:
                release_param(p)

    def begin_phase(self, phase: str) -> None:
        self.position[phase] = 0
        if not self.trace_complete:
            self.trace[phase] = []

    def end_phase(self, phase: str) -> None:
        """After a full forward or backward: finish prefetches, release everything not persistent."""
        for handle in {id(h): h for h in self.inflight.values()}.values():
            handle.wait()
        self.inflight.clear()
        for p in self.all_params:
            release_param(p)
        self.position[phase] = 0
        if phase == "bwd" and self.trace["fwd"]:
            self.trace_complete = True


class DeepSpeedZeroOptimizer_Stage3(ZeroOptimizerBase):  # noqa: N801 - DeepSpeed's class name
    def __init__(self, module: torch.nn.Module, init_optimizer, loss_scaler, clip_grad: float = 0.0,
                 dp_process_group=None, reduce_bucket_size: int = 500_000_000, overlap_comm: bool = False,
                 prefetch_bucket_size: int = 50_000_000, param_persistence_threshold: int = 100_000,
                 max_live_parameters: int = 1_000_000_000, master_device=None, compute_dtype=None):
        super().__init__(init_optimizer, loss_scaler, clip_grad, dp_process_group, master_device)
        self.module = module
        self.coordinator = PartitionedParameterCoordinator(prefetch_bucket_size, max_live_parameters)
        self.fp16_groups: list[list[torch.nn.Parameter]] = []
        self.flat_partitions: list[torch.Tensor] = []  # low-precision, this rank's chunks back to back
        self.grad_partitions: list[torch.Tensor] = []
        self._grad_pieces = {}
        self._hooks = []
        for gi, group in enumerate(init_optimizer.param_groups):
            params = [p for p in group["params"] if p.requires_grad]
            if not params:
                raise ValueError(f"param group {gi} has no trainable parameters")
            for p in params:
                if not is_zero_param(p):
                    partition_param(p, dp_process_group)
            dtype = compute_dtype or params[0].ds_tensor.dtype
            device = params[0].ds_tensor.device
            total = sum(p.ds_tensor.numel() for p in params)
            flat = torch.zeros(total, dtype=dtype, device=device)
            off = 0
            for p in params:
                c = p.ds_tensor.numel()
                flat[off:off + c].copy_(p.ds_tensor)
                p.ds_tensor = flat[off:off + c]
                if p.data.dtype != dtype:
                    p.data = p.data.to(dtype)
                # Every rank owns chunk r of every param, so the bucket splits evenly: one reduce_scatter.
                self._grad_pieces[p] = (gi, [(r, r * c, (r + 1) * c, off) for r in range(self.world_size)])
                off += c
                p.ds_persist = p.ds_numel <= param_persistence_threshold
            self.fp16_groups.append(params)
            self.flat_partitions.append(flat)
            self.grad_partitions.append(torch.zeros(total, dtype=dtype, device=device))
            self.master_partitions.append(flat.detach().to(device=master_device or device,
                                                           dtype=torch.float32).clone())
            self.coordinator.all_params.extend(params)
        self.optimizer = self._wrap_optimizer(init_optimizer)
        self.reducer = GradientBucketReducer(self.grad_partitions, reduce_bucket_size, self.flat_partitions[0].dtype,
                                             overlap_comm, dp_process_group)
        for p in self._grad_pieces:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self._register_module_hooks(module)
        self._gather_persistent()

    def _register_module_hooks(self, module: torch.nn.Module) -> None:
        coord = self.coordinator

        def pre_forward(mod, args):
            coord.fetch_sub_module(mod, "fwd")

        def post_forward(mod, args, output):
            coord.release_sub_module(mod)
            if not torch.is_grad_enabled() or not coord._own(mod):
                return output
            if isinstance(output, torch.Tensor):
                return _PreBackward.apply(coord, mod, output) if output.requires_grad else output
            if isinstance(output, tuple) and any(isinstance(o, torch.Tensor) and o.requires_grad for o in output):
                idx = [i for i, o in enumerate(output) if isinstance(o, torch.Tensor) and o.requires_grad]
                wrapped = _PreBackward.apply(coord, mod, *[output[i] for i in idx])
                wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
                out = list(output)
                for i, w in zip(idx, wrapped):
                    out[i] = w
                return type(output)(out) if type(output) is tuple else output.__class__(*out)
            return output

        for m in module.modules():
            self._hooks.append(m.register_forward_pre_hook(pre_forward))
            self._hooks.append(m.register_forward_hook(post_forward))

    def _grad_ready(self, p: torch.nn.Parameter) -> None:
        gi, pieces = self._grad_pieces[p]
        self.reducer.add(p.grad, pieces, gi)
        p.grad = None
        release_param(p)

    def _gather_persistent(self) -> None:
        persistent = [p for ps in self.fp16_groups for p in ps if p.ds_persist]
        for p in persistent:
            if p.ds_status == ZeroParamStatus.AVAILABLE:
                p.ds_persist = False
                release_param(p)
                p.ds_persist = True
        gather_params(persistent)

    def post_backward(self, is_boundary: bool) -> None:
        self.reducer.finish()
        self.coordinator.end_phase("bwd")

    def reduced_grad_partitions(self) -> list[torch.Tensor]:
        return self.grad_partitions

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.grad_partitions:
            g.zero_()

    def _update_params_from_master(self) -> None:
        for flat, master in zip(self.flat_partitions, self.master_partitions):
            flat.copy_(master)
        self._gather_persistent()

    def memory_tensors(self) -> dict:
        live = [p.data for ps in self.fp16_groups for p in ps if p.ds_status != ZeroParamStatus.NOT_AVAILABLE]
        return {"parameters": list(self.flat_partitions) + live, "gradients": list(self.grad_partitions),
                "optimizer_states": list(self.master_partitions) + self.optimizer_state_tensors()}

    def layout(self) -> dict:
        return {"kind": "chunked", "partition_count": self.world_size,
                "numels": [[p.ds_numel for p in ps] for ps in self.fp16_groups],
                "chunks": [[p.ds_tensor.numel() for p in ps] for ps in self.fp16_groups]}

    @property
    def trainable_param_groups(self) -> list[list[torch.nn.Parameter]]:
        return self.fp16_groups

    def destroy(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
