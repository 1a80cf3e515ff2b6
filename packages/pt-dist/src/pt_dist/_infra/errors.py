"""The errors pt_dist failures surface as, torch's hierarchy: ``DistError`` and its three kinds.

Catching ``DistError`` catches them all; the kinds say where it broke, as torch's do: a store call timed
out (``DistStoreError``), a connection could not be made, was refused or broke (``DistNetworkError``, what
torch's TCPStore raises), a collective or point-to-point call failed in the backend (``DistBackendError``,
what NCCL raises: a peer died, timed out or sent something that does not match).
"""

from __future__ import annotations

import torch.distributed as _dist

# torch's own classes as bases, where torch was built with distributed support: code written for torch
# (``except torch.distributed.DistBackendError``, as elastic agents and DDP's error handling catch) catches ours
_TORCH = _dist.is_available() and hasattr(_dist, "DistBackendError")


def _torch_base(name: str) -> tuple[type, ...]:
    return (getattr(_dist, name),) if _TORCH else ()


class DistError(*_torch_base("DistError"), RuntimeError):
    """A collective, a store call or a rendezvous failed: peer died, timed out, mismatched or refused."""


class DistStoreError(DistError, *_torch_base("DistStoreError")):
    """A store operation failed or timed out (torch's ``DistStoreError``)."""


class DistNetworkError(DistError, *_torch_base("DistNetworkError")):
    """A connection to the store or a peer could not be made, was refused, or broke (torch's ``DistNetworkError``)."""


class DistBackendError(DistError, *_torch_base("DistBackendError")):
    """A collective or point-to-point operation failed in the backend (torch's ``DistBackendError``)."""


def missing_text(ranks) -> str:
    ranks = sorted(set(ranks))
    return f"missing ranks {ranks}" if ranks else "no rank identified as missing"
