"""Per-rank memory accounting for ZeRO, by summing the bytes of the tensors each stage keeps.

ZeRO paper, section 3.1 / Figure 1: with Psi parameters, N ranks, 2-byte params and grads and K
bytes of optimizer state per parameter (K = 12 for mixed-precision Adam: fp32 master, momentum,
variance), per-rank bytes are stage 1: 2Psi + 2Psi + K Psi/N; stage 2: 2Psi + (2+K) Psi/N;
stage 3: (2+2+K) Psi/N, plus whatever parameters are gathered at the moment. Which of a stage's buffers count
as what is read off the optimizer here, so the optimizers hold only the mechanism.
"""

from __future__ import annotations

from ds_zero.runtime.zero.partition_parameters import ZeroParamStatus
from ds_zero.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if t.numel() == 0 or key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def memory_tensors(opt) -> dict:
    """The tensors a ZeRO optimizer keeps where the model computes, by role."""
    states = [] if opt.offload else list(opt.master_partitions) + opt.optimizer_state_tensors()
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        live = [p.data for ps in opt.fp16_groups for p in ps if p.ds_status != ZeroParamStatus.NOT_AVAILABLE]
        resident = [] if opt.offload_param else list(opt.flat_partitions)
        return {"parameters": resident + live, "gradients": list(opt.grad_partitions), "optimizer_states": states}
    grads = opt.grad_partitions if opt.partition_grads else opt.flat_grads
    return {"parameters": list(opt.flat_groups), "gradients": list(grads), "optimizer_states": states}


def offloaded_tensors(opt) -> dict:
    """The tensors ZeRO-Offload keeps in host memory, by role: masters, their gradients and moments; stage 3's
    parameter partitions (``offload_param``), or ZeRO-Infinity's swap buffers."""
    host = {}
    if opt.offload:
        host = {"optimizer_states": list(opt.master_partitions) + opt.optimizer_state_tensors(),
                "gradients": list(opt.fp32_grads)}
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        if opt.offload_param and opt.nvme is None:
            host["parameters"] = list(opt.flat_partitions)
        if opt.nvme is not None:
            host.update(opt.nvme.host_tensors())
    return host


def memory_breakdown(engine) -> dict:
    """``{"parameters", "gradients", "optimizer_states", "total"}``: bytes this rank keeps where it computes,
    plus ``"offload"``: ``{"cpu": {...}, "nvme": {...}}``, the bytes ZeRO-Offload keeps in host memory (summed
    tensor bytes) and on disk (bytes of the swap files' live tensors)."""
    opt = engine.optimizer
    parts = memory_tensors(opt)
    out = {k: _bytes(v) for k, v in parts.items()}
    out["total"] = sum(out.values())
    host = offloaded_tensors(opt)
    cpu = {k: _bytes(host.get(k, [])) for k in ("parameters", "gradients", "optimizer_states")}
    cpu["total"] = sum(cpu.values())
    nvme = opt.nvme.nvme_bytes() if getattr(opt, "nvme", None) is not None else {}
    nvme["total"] = sum(nvme.values())
    out["offload"] = {"cpu": cpu, "nvme": nvme}
    return out


def zero_memory_formula(num_params: int, world_size: int, stage: int, param_bytes: int = 2,
                        optimizer_bytes: int = 12) -> dict:
    """The paper's per-rank estimate, split the same way as :func:`memory_breakdown`."""
    psi, n, k, b = num_params, world_size, optimizer_bytes, param_bytes
    params = b * psi / n if stage >= 3 else b * psi
    grads = b * psi / n if stage >= 2 else b * psi
    states = k * psi / n if stage >= 1 else k * psi
    return {"parameters": params, "gradients": grads, "optimizer_states": states,
            "total": params + grads + states}
