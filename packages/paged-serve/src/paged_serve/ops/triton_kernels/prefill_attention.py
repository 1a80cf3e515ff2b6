"""Triton prefill / chunked-prefill attention reading K/V through the block table (vLLM ``context_attention_fwd``).

Grid: (sequence, query head, tile of ``BLOCK_M`` new tokens). Each program runs FlashAttention's tiled online
softmax over the sequence's cached keys ``BLOCK_N`` tokens at a time; each key row is gathered from
``cache[block_tables[s, n // block_size], n % block_size]``, so ``BLOCK_N`` is independent of the cache block
size (block size 8 still feeds 16-wide ``tl.dot`` tiles). The new tokens are the last ``q_len`` of the
``context_len`` cached ones, so the causal mask is bottom-right aligned and tiles wholly in the future are
never loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_prefill_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    context_lens_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    block_size,
    head_size,
    QUERY_GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    start_m = tl.program_id(2) * BLOCK_M
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if start_m >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    kv_head = head // QUERY_GROUP_SIZE

    offs_m = start_m + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_PAD)
    m_mask = offs_m < q_len
    d_mask = d < head_size
    q_pos = context_len - q_len + offs_m  # absolute position of each new token in its sequence
    q_off = (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    # keys after the tile's last query are masked for every row, so stop there
    kv_end = tl.minimum(context_len, context_len - q_len + start_m + BLOCK_M)
    for start_n in range(0, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        blocks = tl.load(block_tables_ptr + seq * stride_bt + offs_n // block_size, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % block_size
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k_off = blocks[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        k = tl.load(k_cache_ptr + k_off, mask=kv_mask, other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        causal = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        scores = tl.where(causal, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_off = blocks[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :]
        v = tl.load(v_cache_ptr + v_off, mask=kv_mask, other=0.0)
        p = p.to(v_cache_ptr.dtype.element_ty)  # P in the cache dtype for the tensor-core P @ V, as FlashAttention
        if UPCAST_DOT:
            v = v.to(tl.float32)
            p = p.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Triton prefill attention; same contract as :func:`paged_serve.ops.reference.paged_prefill_attention`.

    ``max_query_len`` sizes the grid; pass it when known to avoid a device-to-host sync.
    """
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    num_seqs = query_start_loc.shape[0] - 1
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    for name, t in (("query", query), ("out", out), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_size) dim, got strides {t.stride()}")
    big = query.is_cuda
    # fp32 tiles are twice the bytes: halve them on GPU to stay within shared memory; 16 (tl.dot's minimum)
    # keeps the interpreter's per-program work small on CPU
    block_m = block_n = (64 if query.dtype != torch.float32 else 32) if big else 16
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, block_m))
    _paged_prefill_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        context_lens,
        float(scale),
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_tables.stride(0),
        key_cache.shape[1],
        head_size,
        QUERY_GROUP_SIZE=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_PAD=triton.next_power_of_2(head_size),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 or not big else "tf32",
        # Triton 3.9's interpreter multiplies bf16 tiles' raw bits in tl.dot; on CPU the (exactly representable)
        # bf16 values are widened to fp32 first, which gives the same products as a bf16 MMA accumulating in fp32.
        UPCAST_DOT=not big and query.dtype != torch.float32,
    )
    return out
