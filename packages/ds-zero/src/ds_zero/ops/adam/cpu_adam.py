"""``DeepSpeedCPUAdam``: Adam / AdamW on fp32 CPU tensors in one fused pass (DeepSpeed's ``ops/adam/cpu_adam.py``).

ZeRO-Offload's step runs here: the fp32 master partition, its gradient and both moments live in host
memory, and the update can write the rounded low-precision copy of the parameters in the same pass
(``step(fp16_param_groups=...)``), as DeepSpeed's ``adam_update_copy`` did. The kernel is
``csrc/adam/cpu_adam.cpp``, built on first use; without a compiler the same arithmetic runs as torch
in-place ops over tiles (logged once).
"""

from __future__ import annotations

import logging

import torch

from ds_zero._infra.op_builder import CPUAdamBuilder, OpBuildError

logger = logging.getLogger(__name__)

_TILE = 1 << 16
_fallback_logged = False


def _load_kernel(use_kernel: bool | None):
    global _fallback_logged
    if use_kernel is False:
        return None
    try:
        return CPUAdamBuilder().load()
    except OpBuildError as e:
        if use_kernel:
            raise
        if not _fallback_logged:
            logger.warning("%s; CPUAdam uses its pure-torch path (same results, slower)", e)
            _fallback_logged = True
        return None


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    """Same arguments as DeepSpeed's; ``use_kernel`` = None (C++ if it builds), True (must build), False (torch)."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True, use_kernel: bool | None = None):
        if amsgrad:
            raise ValueError("amsgrad is not supported by CPUAdam (as in DeepSpeed)")
        if not fp32_optimizer_states:
            raise ValueError("CPUAdam keeps fp32 optimizer states (fp32_optimizer_states=False is not supported)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, amsgrad=False)
        super().__init__(model_params, defaults)
        self.adamw_mode = adamw_mode
        self.kernel = _load_kernel(use_kernel)

    @property
    def uses_kernel(self) -> bool:
        return self.kernel is not None

    def init_state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
        return state

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        """``fp16_param_groups``: per group, a tensor (or list per param) receiving the updated params' rounding."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            outs = None if fp16_param_groups is None else fp16_param_groups[gi]
            if torch.is_tensor(outs):
                outs = [outs]
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.device.type != "cpu":
                    raise RuntimeError(f"CPUAdam param is on {p.device}; it must be on the CPU (enable "
                                       "zero_optimization.offload_optimizer)")
                state = self.init_state(p)
                state["step"] += 1
                out = None if outs is None else outs[pi]
                if p.dtype != torch.float32:
                    # A low-precision param is its own master (as DeepSpeed's kernel allows): step an fp32 copy.
                    p32 = p.data.float()
                    self.update(p32, p.grad.float(), state["exp_avg"], state["exp_avg_sq"], state["step"], group, out)
                    p.data.copy_(p32)
                    continue
                self.update(p.data, p.grad.data, state["exp_avg"], state["exp_avg_sq"], state["step"], group, out)
        return loss

    def update(self, param, grad, exp_avg, exp_avg_sq, step: int, group: dict, out=None) -> None:
        """One step on explicit tensors (the NVMe swapper passes buffers it swapped in)."""
        beta1, beta2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        if group["bias_correction"]:
            # In double, exactly as torch.optim.Adam(W) computes them.
            step_size = lr / (1 - beta1**step)
            bc2_sqrt = (1 - beta2**step) ** 0.5
        else:
            step_size, bc2_sqrt = lr, 1.0
        decay = 1 - lr * wd if self.adamw_mode else wd
        if self.kernel is not None:
            self.kernel.adam_update(param, grad.contiguous(), exp_avg, exp_avg_sq, lr, beta1, beta2, eps, decay,
                                    step_size, bc2_sqrt, self.adamw_mode, out)
            return
        p, g, m, v = (t.view(-1) for t in (param, grad, exp_avg, exp_avg_sq))
        o = None if out is None else out.view(-1)
        for lo in range(0, p.numel(), _TILE):
            hi = min(lo + _TILE, p.numel())
            pt, gt, mt, vt = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
            if self.adamw_mode:
                if wd != 0:
                    pt.mul_(decay)
            elif wd != 0:
                gt = gt.add(pt, alpha=wd)
            mt.lerp_(gt, 1 - beta1)
            vt.mul_(beta2).addcmul_(gt, gt, value=1 - beta2)
            denom = (vt.sqrt() / bc2_sqrt).add_(eps)
            pt.addcdiv_(mt, denom, value=-step_size)
            if o is not None:
                o[lo:hi].copy_(pt)


class CPUAdam(DeepSpeedCPUAdam):
    """Adam with L2 weight decay in the gradient (``torch.optim.Adam``'s rule)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kw):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=False, **kw)


class CPUAdamW(DeepSpeedCPUAdam):
    """AdamW: decoupled weight decay (``torch.optim.AdamW``'s rule)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kw):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True, **kw)
