"""What FSDP1's files share (torch's fsdp/_common_utils.py): the arguments that shape the mechanism (torch's
fsdp/api.py ``ShardingStrategy``, ``BackwardPrefetch``, ``MixedPrecision``, ``CPUOffload``, same names and
fields) and the names FSDP adds to a module's (``_fsdp_wrapped_module``, ``_flat_param``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

import torch

FSDP_WRAPPED_MODULE = "_fsdp_wrapped_module"
FLAT_PARAM = "_flat_param"


class ShardingStrategy(Enum):
    """FULL_SHARD: parameters, gradients, optimizer state sharded; parameters gathered for each unit's forward and
    backward and freed after each. SHARD_GRAD_OP: parameters kept gathered from forward to the end of backward.
    NO_SHARD: replicated, gradients all-reduced (DDP). HYBRID_SHARD: FULL_SHARD inside a shard group (a node),
    replicated across the groups; _HYBRID_SHARD_ZERO2: the same with SHARD_GRAD_OP inside."""

    FULL_SHARD = auto()
    SHARD_GRAD_OP = auto()
    NO_SHARD = auto()
    HYBRID_SHARD = auto()
    _HYBRID_SHARD_ZERO2 = auto()


class BackwardPrefetch(Enum):
    """When backward starts the previous unit's all-gather: before this unit's gradient computation (BACKWARD_PRE,
    ahead of this unit's reduce-scatter on the group's queue) or after it (BACKWARD_POST, behind it)."""

    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


@dataclass
class MixedPrecision:
    """Compute in ``param_dtype`` (the all-gathered parameters), reduce gradients in ``reduce_dtype`` (default:
    ``param_dtype``), keep buffers in ``buffer_dtype``; the sharded parameters and the optimizer stay in their own
    dtype (fp32)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True


@dataclass
class CPUOffload:
    offload_params: bool = False


def clean_tensor_name(name: str) -> str:
    """The plain module's name: FSDP's and ``checkpoint_wrapper``'s wrapper prefixes dropped (torch's
    ``clean_tensor_name``), so ``FSDP(checkpoint_wrapper(layer))`` saves the names ``FSDP(layer)`` does."""
    return name.replace(f"{FSDP_WRAPPED_MODULE}.", "").replace("_checkpoint_wrapped_module.", "")
