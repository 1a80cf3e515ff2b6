"""Triton PagedAttention kernels: one file per kernel family (cache writes/copies, decode, prefill)."""
