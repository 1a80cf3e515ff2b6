"""Per-rank memory accounting for ZeRO, by summing the bytes of the tensors each stage keeps.

ZeRO paper, section 3.1 / Figure 1: with Psi parameters, N ranks, 2-byte params and grads and K
bytes of optimizer state per parameter (K = 12 for mixed-precision Adam: fp32 master, momentum,
variance), per-rank bytes are stage 1: 2Psi + 2Psi + K Psi/N; stage 2: 2Psi + (2+K) Psi/N;
stage 3: (2+2+K) Psi/N, plus whatever parameters are gathered at the moment.
"""

from __future__ import annotations


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if t.numel() == 0 or key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def memory_breakdown(engine) -> dict:
    """``{"parameters", "gradients", "optimizer_states", "total"}``: bytes this rank keeps where it computes,
    plus ``"offload"``: ``{"cpu": {...}, "nvme": {...}}``, the bytes ZeRO-Offload keeps in host memory (summed
    tensor bytes) and on disk (bytes of the swap files' live tensors)."""
    opt = engine.optimizer
    parts = opt.memory_tensors()
    out = {k: _bytes(v) for k, v in parts.items()}
    out["total"] = sum(out.values())
    host = opt.offloaded_tensors() if hasattr(opt, "offloaded_tensors") else {}
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
