"""The error every pt_dist failure surfaces as (torch's ``DistError`` / ``DistBackendError`` / ``DistStoreError``)."""

from __future__ import annotations


class DistError(RuntimeError):
    """A collective, a store call or a rendezvous failed: peer died, timed out, mismatched or refused."""


class DistStoreError(DistError):
    """A store operation failed or timed out (torch's ``DistStoreError``)."""


def missing_text(ranks) -> str:
    ranks = sorted(set(ranks))
    return f"missing ranks {ranks}" if ranks else "no rank identified as missing"
