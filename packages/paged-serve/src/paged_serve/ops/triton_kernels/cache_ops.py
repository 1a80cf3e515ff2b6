"""Triton cache kernels: ``reshape_and_cache`` (scatter new K/V into slots) and ``copy_blocks`` (copy-on-write).

Mirrors vLLM's ``csrc/cache_kernels.cu``: one program per (token, kv head) writes a head vector to
``cache[slot // block_size, slot % block_size, head]``; one program per (mapping row, chunk) copies a block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    block_size,
    head_size,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token of a CUDA-graph-sized batch: nothing to write
        return
    block = slot // block_size
    offset = slot % block_size
    d = tl.arange(0, HEAD_PAD)
    mask = d < head_size
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + d, mask=mask)
    k_dst = key_cache_ptr + block * stride_kcb + offset * stride_kcs + head * stride_kch + d
    v_dst = value_cache_ptr + block * stride_vcb + offset * stride_vcs + head * stride_vch + d
    tl.store(k_dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton ``reshape_and_cache``; same contract as :func:`paged_serve.ops.reference.reshape_and_cache`."""
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_size) dim, got strides {t.stride()}")
    _reshape_and_cache_kernel[(num_tokens, num_kv_heads)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        key_cache.shape[1],
        head_size,
        HEAD_PAD=triton.next_power_of_2(head_size),
    )


@triton.jit
def _copy_blocks_kernel(cache_ptr, mapping_ptr, block_numel, CHUNK: tl.constexpr):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(mapping_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    data = tl.load(cache_ptr + src * block_numel + offs, mask=mask)
    tl.store(cache_ptr + dst * block_numel + offs, data, mask=mask)


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Triton ``copy_blocks``: ``block_mapping`` ``[num_pairs, 2]`` of (src, dst) block numbers, every layer.

    A destination is never also a source in one call (the block manager's CoW pairs guarantee it), so the
    programs are independent.
    """
    if block_mapping.numel() == 0:
        return
    mapping = block_mapping.to(device=key_caches[0].device, dtype=torch.int64).contiguous()
    for cache in (*key_caches, *value_caches):
        if not cache.is_contiguous():
            raise ValueError(f"copy_blocks needs contiguous caches, got strides {cache.stride()}")
        block_numel = cache[0].numel()
        chunk = min(triton.next_power_of_2(block_numel), 4096)
        grid = (mapping.shape[0], triton.cdiv(block_numel, chunk))
        _copy_blocks_kernel[grid](cache, mapping, block_numel, CHUNK=chunk)
