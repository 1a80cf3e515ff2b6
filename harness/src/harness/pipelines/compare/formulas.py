"""The papers' formulas, next to which the measurements are printed, and the implementation's exact counts.

Memory per rank (ZeRO, Rajbhandari et al. 2020, section 3 / Figure 1), with Psi parameters, N ranks, p and g bytes
per parameter and gradient and K bytes of optimizer state (K = 12 for mixed-precision Adam; 8 for fp32 Adam, 12
when an fp32 master copy is kept as DeepSpeed does):
DDP (p+g+K)Psi; ZeRO-1 (p+g)Psi + K Psi/N; ZeRO-2 p Psi + (g+K)Psi/N; ZeRO-3 / FSDP (p+g+K)Psi/N.

Communication per step, as volume (ZeRO section 7): DDP 2Psi (one all-reduce of the gradients), ZeRO-1/2 2Psi
(reduce-scatter + all-gather), ZeRO-3 3Psi (an all-gather in forward and in backward, a reduce-scatter);
Megatron TP (Shoeybi et al. 2019, section 3) 4 all-reduces of b*s*h per layer (2 forward, 2 backward), sequence
parallelism (Korthikanti et al. 2022) the same volume as all-gathers and reduce-scatters; 1F1B pipeline
parallelism one b*s*h activation forward and one gradient backward per micro-batch and stage boundary.
"""

from __future__ import annotations

import math

# strategy -> which kinds of state are split N ways
SHARDED = {
    "torch-ddp": (), "pt-dist-ddp": (),
    "zero-1": ("optimizer_states",), "zero-2": ("gradients", "optimizer_states"),
    "zero-2-offload": ("gradients", "optimizer_states"),
    "zero-3": ("parameters", "gradients", "optimizer_states"),
    "deepspeed-zero-2": ("gradients", "optimizer_states"),
    "deepspeed-zero-3": ("parameters", "gradients", "optimizer_states"),
    "pt-dist-fsdp": ("parameters", "gradients", "optimizer_states"),
    "torch-fsdp2": ("parameters", "gradients", "optimizer_states"),
    "tp": ("parameters", "gradients", "optimizer_states"), "tp-sp": ("parameters", "gradients", "optimizer_states"),
    "pp": ("parameters", "gradients", "optimizer_states"),
}
PAPER_VOLUME_PSI = {"torch-ddp": 2, "pt-dist-ddp": 2, "zero-1": 2, "zero-2": 2, "zero-2-offload": 2, "zero-3": 3,
                    "pt-dist-fsdp": 3, "torch-fsdp2": 3, "deepspeed-zero-2": 2, "deepspeed-zero-3": 3}


def zero_memory(psi: int, n: int, stage: int, p: int = 2, g: int = 2, k: int = 12) -> dict:
    """Bytes per rank by kind for ZeRO stage 0 (DDP) to 3."""
    return {"parameters": p * psi / (n if stage >= 3 else 1), "gradients": g * psi / (n if stage >= 2 else 1),
            "optimizer_states": k * psi / (n if stage >= 1 else 1)}


def padded(numel: int, n: int) -> int:
    return math.ceil(numel / n) * n


def expected_comm(name: str, n: int, shape: dict, param_numels: list[int], unit_numels: list[int],
                  bytes_per: int = 4, zero_collectives: str = "owner") -> dict:
    """The exact per-step payload bytes by op this repository's implementation of ``name`` moves.

    ``shape``: ``layers``, ``batch`` (sequences per step, all ranks), ``micro_batch`` (per rank for data
    parallelism), ``seq``, ``hidden``, ``vocab``; ``param_numels``: every parameter's size; ``unit_numels``: the
    parameter count of each FSDP unit, the root (what no decoder layer holds) first. ``zero_collectives``:
    ``"owner"`` (gradients reduce-scattered to their owners) or ``"allreduce"`` (ds-zero's default on gloo).
    """
    psi = sum(param_numels)
    if name in ("torch-ddp", "pt-dist-ddp"):
        return {"all_reduce": psi * bytes_per}
    norm = 4  # the gradient norm's all-reduce (one fp32)
    if name in ("zero-1", "zero-2", "zero-2-offload", "zero-3"):
        if name == "zero-3":  # every parameter gathered once, each padded to N chunks: the default
            # stage3_max_reuse_distance (1e9 elements) covers the model, so forward's gathers are kept for backward
            flat = sum(padded(k, n) for k in param_numels) * bytes_per
            out = {"all_gather_into_tensor": flat}
        else:  # one flat buffer padded to N partitions, gathered once after the step
            flat = padded(psi, n) * bytes_per
            out = {"all_gather_into_tensor": flat}
        if zero_collectives == "owner":
            return {**out, "reduce_scatter_tensor": flat, "all_reduce": norm}
        return {**out, "all_reduce": psi * bytes_per + norm}
    if name in ("pt-dist-fsdp", "torch-fsdp2"):  # the root unit stays gathered from forward to backward
        root, layers = padded(unit_numels[0], n), [padded(k, n) for k in unit_numels[1:]]
        gather, scatter = (root + 2 * sum(layers)) * bytes_per, (root + sum(layers)) * bytes_per
        ops = ("all_gather_into_tensor", "reduce_scatter_tensor") if name == "pt-dist-fsdp" else (
            "all_gather_single", "reduce_scatter_single")
        return {ops[0]: gather, ops[1]: scatter}
    bsh = shape["batch"] * shape["seq"] * shape["hidden"] * bytes_per
    if name == "tp":  # 4 per layer + the embedding's forward and the output layer's backward all-reduce
        cross_entropy = 3 * shape["batch"] * shape["seq"] * 4  # vocab-parallel max, target logit, sum of exp
        return {"all_reduce": (4 * shape["layers"] + 2) * bsh + cross_entropy + norm}
    raise KeyError(name)


def tp_paper_volume(shape: dict, bytes_per: int = 4) -> int:
    """Megatron's 4 all-reduces of b*s*h per layer per step, as volume (2x payload)."""
    return 2 * 4 * shape["layers"] * shape["batch"] * shape["seq"] * shape["hidden"] * bytes_per


def pp_paper_volume(shape: dict, stages: int, bytes_per: int = 4) -> int:
    """Total over ranks: each of the step's micro-batches crosses every stage boundary forward and backward."""
    return 2 * (stages - 1) * shape["batch"] * shape["seq"] * shape["hidden"] * bytes_per


def bytes_per_param(name: str, memory: dict, psi: int, n: int) -> dict:
    """Per kind, the bytes one parameter costs: replicated kinds as measured, sharded kinds times N."""
    sharded = SHARDED.get(name, ())
    out = {}
    for kind in ("parameters", "gradients", "optimizer_states"):
        b = memory.get(kind, 0) / psi
        out[kind] = b * n if kind in sharded else b
    return out


def bytes_per_device(name: str, memory: dict, psi: int, n: int, devices: int, tp_limit: int = 8) -> float:
    """State bytes per parameter on each of ``devices`` devices, from memory measured on ``n`` ranks."""
    per_param = bytes_per_param(name, memory, psi, n)
    sharded = SHARDED.get(name, ())
    split = min(devices, tp_limit) if name in ("tp", "tp-sp") else devices
    return sum(b / (split if kind in sharded else 1) for kind, b in per_param.items())


def largest_model(name: str, per_param: dict, devices: int, budget_bytes: float, tp_limit: int = 8) -> float:
    """The parameter count whose parameters, gradients and optimizer states fit ``budget_bytes`` per device on
    ``devices`` devices (activations, buffers and fragmentation not counted): a sharded kind costs its bytes per
    parameter divided by the devices it is split over (TP at most ``tp_limit``: one node's NVLink domain)."""
    sharded = SHARDED.get(name, ())
    split = devices
    if name in ("tp", "tp-sp"):
        split = min(devices, tp_limit)
    cost = sum(b / (split if kind in sharded else 1) for kind, b in per_param.items())
    return budget_bytes / cost if cost else float("inf")
