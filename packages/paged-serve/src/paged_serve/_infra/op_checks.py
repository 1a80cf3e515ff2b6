"""Argument checks of the PagedAttention ops (``ops/paged_attn.py`` calls one per op before it dispatches): the
cache layout, the heads, dtypes and index tensors a kernel would otherwise misread, each error naming the value.

vLLM's C++ ops check the same with ``TORCH_CHECK``; the textbook op stays in ``paged_attn.py``, the hardening here.
"""

from __future__ import annotations

import torch

SUPPORTED_BLOCK_SIZES = (8, 16, 32)


def _index(name: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")


def kernel_index(name: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An index tensor as the Triton kernels read it: on the data's device, contiguous (a kernel walks its rows
    with unit stride; a strided view would be read as if packed)."""
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the tensors it indexes are on {device}")
    return t.contiguous()


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_size], got shape {tuple(key_cache.shape)}"
        )
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} differ")
    block_size = key_cache.shape[1]
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} not supported; use one of {SUPPORTED_BLOCK_SIZES}")


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    check_cache(key_cache, value_cache)
    if key.shape != value.shape or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match cache heads {tuple(key_cache.shape[2:])}"
        )
    if slot_mapping.shape != key.shape[:1]:
        raise ValueError(f"slot_mapping shape {tuple(slot_mapping.shape)} != ({key.shape[0]},)")
    _index("slot_mapping", slot_mapping)


def _check_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    check_cache(key_cache, value_cache)
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, num_heads, head_size], got shape {tuple(query.shape)}")
    num_heads, head_size = query.shape[1:]
    num_kv_heads, cache_head_size = key_cache.shape[2:]
    if head_size != cache_head_size:
        raise ValueError(f"query head_size {head_size} != cache head_size {cache_head_size}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")


def check_decode(query, key_cache, value_cache, block_tables, context_lens) -> None:
    _check_attention(query, key_cache, value_cache)
    if block_tables.dim() != 2 or block_tables.shape[0] != query.shape[0] or context_lens.shape != query.shape[:1]:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
            f"do not match {query.shape[0]} sequences"
        )
    _index("block_tables", block_tables)
    _index("context_lens", context_lens)


def check_prefill(query, key_cache, value_cache, block_tables, query_start_loc, context_lens) -> None:
    _check_attention(query, key_cache, value_cache)
    num_seqs = query_start_loc.shape[0] - 1
    if block_tables.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
            f"do not match {num_seqs} sequences from query_start_loc"
        )
    for name, t in (("block_tables", block_tables), ("query_start_loc", query_start_loc),
                    ("context_lens", context_lens)):  # fmt: skip
        _index(name, t)


def check_copy_blocks(key_caches, value_caches) -> None:
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
