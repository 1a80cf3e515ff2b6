"""FSDP2's policies: ``MixedPrecisionPolicy``, ``OffloadPolicy``, ``CPUOffloadPolicy`` (torch's
torch/distributed/fsdp/_fully_shard/_fsdp_api.py, same fields and defaults)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CPUOffloadPolicy", "MixedPrecisionPolicy", "OffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Casts at all-gather time, not per op (unlike autocast).

    ``param_dtype``: the unsharded parameters' dtype (and the all-gather's), the forward's compute dtype; ``None``
    keeps the original. ``reduce_dtype``: the gradient reduce-scatter / all-reduce dtype and the dtype gradients
    accumulate in without sync; ``None`` means the parameter's original dtype (torch 2.15's rule: no longer
    ``param_dtype``). ``output_dtype``: cast of floating-point forward outputs. ``cast_forward_inputs``: cast
    floating-point forward inputs to ``param_dtype``. The optimizer always steps the sharded originals."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading: the default ``offload_policy``."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Keep sharded parameters, sharded gradients (and so the optimizer state) on CPU: copied to the mesh's device
    before the all-gather, gradients copied back after the reduce-scatter. ``pin_memory``: pin the CPU copies (only
    meaningful with a CUDA mesh)."""

    pin_memory: bool = True


def _validate_policies(mp_policy, offload_policy) -> None:
    """Bad policy types or fields raise naming the value (torch fails later, or silently ignores an offload
    policy of the wrong type)."""
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {mp_policy!r}")
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp_policy, name)
        if value is not None and not isinstance(value, torch.dtype):
            raise TypeError(f"fully_shard: MixedPrecisionPolicy.{name} must be a torch.dtype or None, got {value!r}")
    if not isinstance(mp_policy.cast_forward_inputs, bool):
        raise TypeError("fully_shard: MixedPrecisionPolicy.cast_forward_inputs must be a bool, got "
                        f"{mp_policy.cast_forward_inputs!r}")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"fully_shard: offload_policy must be an OffloadPolicy (e.g. CPUOffloadPolicy()), got "
                        f"{offload_policy!r}")
