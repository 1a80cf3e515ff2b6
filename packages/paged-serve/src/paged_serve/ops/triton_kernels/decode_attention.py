"""Triton PagedAttention decode kernel (vLLM ``paged_attention_v1``): one query token per sequence.

One program per (sequence, kv head) walks the sequence's block table one physical block at a time and keeps an
online softmax (running max ``m``, normaliser ``l``, accumulator; FlashAttention section 3.1) in fp32. All query
heads sharing the kv head (GQA/MQA group) are handled by the same program, so each K/V block is read once per
group instead of once per query head. Head sizes that are not powers of two (80, 96) use a padded ``tl.arange``
and masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_decode_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale,
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    head_size,
    QUERY_GROUP_SIZE: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    tok = tl.arange(0, BLOCK_SIZE)
    g_mask = g < QUERY_GROUP_SIZE
    d_mask = d < head_size
    heads = kv_head * QUERY_GROUP_SIZE + g
    q_off = seq * stride_qs + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    for j in range(0, num_blocks):
        block = tl.load(block_tables_ptr + seq * stride_bt + j).to(tl.int64)
        t_mask = j * BLOCK_SIZE + tok < context_len
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_off = block * stride_kb + tok[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        k = tl.load(k_cache_ptr + k_off, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(t_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_off = block * stride_vb + tok[:, None] * stride_vs + kv_head * stride_vh + d[None, :]
        v = tl.load(v_cache_ptr + v_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty context writes zeros rather than NaN
    o_off = seq * stride_os + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton decode attention; same contract as :func:`paged_serve.ops.reference.paged_attention`."""
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    for name, t in (("query", query), ("out", out), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_size) dim, got strides {t.stride()}")
    _paged_attention_decode_kernel[(num_seqs, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
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
        head_size,
        QUERY_GROUP_SIZE=group,
        GROUP_PAD=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_PAD=triton.next_power_of_2(head_size),
    )
    return out
