"""Autograd-aware collectives (torch.distributed.nn)."""

from pt_dist.nn import functional

__all__ = ["functional"]
