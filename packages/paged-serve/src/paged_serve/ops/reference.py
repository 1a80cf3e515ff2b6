"""Pure-torch PagedAttention ops: the CPU run-time path and the oracle the Triton kernels are tested against.

KV cache layout (vLLM's flash-attention layout): ``key_cache``/``value_cache`` are ``[num_blocks, block_size,
num_kv_heads, head_size]``; a sequence's token ``i`` lives in block ``block_tables[s, i // block_size]`` at offset
``i % block_size`` (PagedAttention paper, section 4.1). A slot is ``block_number * block_size + offset``.
"""

from __future__ import annotations

import torch


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into their cache slots in place.

    A negative slot marks a padding token and is skipped, as in vLLM's ``reshape_and_cache`` CUDA op.
    """
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(torch.long)
    valid = slots >= 0
    slots = slots[valid]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[valid].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[valid].to(value_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence as a contiguous ``[length, num_kv_heads, head_size]`` tensor."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = block_table[:num_blocks].to(torch.long)
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def _decode_bucket(query, key_cache, value_cache, block_tables, lens, scale) -> torch.Tensor:
    """fp32 decode attention of one bucket of sequences, gathered to the bucket's longest context."""
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    max_len = int(lens.max())
    num_blocks = -(-max_len // block_size)
    blocks = block_tables[:, :num_blocks].to(device=query.device, dtype=torch.long)
    valid = torch.arange(num_blocks * block_size, device=query.device)[None, :] < lens[:, None]  # [S, L]
    keep = valid[:, :, None, None]

    def gather(cache):
        kv = cache[blocks].reshape(num_seqs, num_blocks * block_size, num_kv_heads, head_size).float()
        # the gather made a copy (and .float() another, or none), so zeroing it in place touches no cache block
        return kv.masked_fill_(~keep, 0.0).transpose(1, 2)  # [S, kv_heads, L, D]

    attn = torch.nn.functional.scaled_dot_product_attention(
        query.float()[:, :, None, :],
        gather(key_cache),
        gather(value_cache),
        attn_mask=valid[:, None, None, :],
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return attn[:, :, 0, :]


DECODE_BUCKET = 16


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: one query token per sequence over its paged K/V (vLLM ``paged_attention_v1``).

    ``query`` ``[num_seqs, num_heads, head_size]``; GQA/MQA when ``num_heads`` is a multiple of the cache's
    ``num_kv_heads``. Sequences are sorted by length and taken ``DECODE_BUCKET`` at a time; each bucket's whole
    blocks are gathered (one contiguous copy per block, not per token) into ``[seqs, kv_heads, max_len,
    head_size]`` (similar lengths: little padding), slots past each length are zeroed (a stale or never-written
    slot may hold anything, NaN included) and masked, and fp32 SDPA does the rest.
    """
    num_seqs, num_heads, head_size = query.shape
    lens = context_lens.to(device=query.device, dtype=torch.long)
    result = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float32, device=query.device)
    nonempty = (lens > 0).nonzero().flatten()  # an empty context attends to nothing: zeros
    if len(nonempty):
        order = nonempty[torch.argsort(lens[nonempty])]
        for bucket in order.split(DECODE_BUCKET):
            result[bucket] = _decode_bucket(
                query[bucket], key_cache, value_cache, block_tables[bucket], lens[bucket], scale
            )
    if out is None:
        return result.to(query.dtype)
    out.copy_(result)
    return out


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill / chunked prefill over the paged cache with a causal mask.

    ``query`` ``[num_tokens, num_heads, head_size]`` packs each sequence's new tokens back to back;
    ``query_start_loc`` ``[num_seqs + 1]`` are their offsets (cu_seqlens). ``context_lens[s]`` counts all of
    sequence ``s``'s tokens already in the cache *including* the new ones (written by ``reshape_and_cache``
    first), so the new tokens are the last ``q_len`` positions: query ``i`` sits at position
    ``context_len - q_len + i`` and sees keys up to it (bottom-right aligned causal mask, as in vLLM's
    ``context_attention_fwd`` for prefix-cached / chunked prefill).
    """
    num_heads, head_size = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    result = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s, ctx in enumerate(lens):
        q_len = starts[s + 1] - starts[s]
        if q_len == 0:
            continue
        rows = slice(starts[s], starts[s + 1])
        q = query[rows].float().transpose(0, 1)  # [H, q_len, D]
        if key is not None and q_len == ctx:  # no cached context: the new K/V are all of it
            k, v = key[rows].float().transpose(0, 1), value[rows].float().transpose(0, 1)
        else:
            k = gather_kv(key_cache, block_tables[s], ctx).float().transpose(0, 1)  # [kv_heads, ctx, D]
            v = gather_kv(value_cache, block_tables[s], ctx).float().transpose(0, 1)
        if q_len == ctx:
            mask, causal = None, True  # a whole prompt: plain causal
        else:  # new tokens after cached context: query i sits at position ctx - q_len + i
            mask = (
                torch.arange(ctx, device=query.device)[None, :]
                <= torch.arange(ctx - q_len, ctx, device=query.device)[:, None]
            )
            causal = False
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=num_heads != num_kv_heads
        )
        result[rows] = o.transpose(0, 1)
    if out is None:
        return result.to(query.dtype)
    out.copy_(result)
    return out


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy-on-write: for every layer copy block ``src`` to block ``dst`` for each row of ``block_mapping``."""
    if block_mapping.numel() == 0:
        return
    mapping = block_mapping.to(device=key_caches[0].device, dtype=torch.long)
    src, dst = mapping[:, 0], mapping[:, 1]
    for cache in (*key_caches, *value_caches):
        cache[dst] = cache[src]


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy blocks between two caches, usually on different devices (swap out: GPU -> CPU, swap in: back).

    Like vLLM's ``swap_blocks`` (``cudaMemcpyAsync`` per block) this is a copy engine's job, not a kernel's: the
    blocks are gathered on the source device, moved in one transfer, and scattered on the destination.
    """
    if block_mapping.numel() == 0:
        return
    mapping = block_mapping.to(torch.long).cpu()
    src_idx = mapping[:, 0].to(src.device)
    dst_idx = mapping[:, 1].to(dst.device)
    moved = src[src_idx]
    if dst.device.type == "cuda" and moved.device.type == "cpu":
        # host -> device from pinned memory can overlap; device -> host stays blocking, since the scatter below
        # reads the host copy right away
        dst[dst_idx] = moved.pin_memory().to(dst.device, non_blocking=True)
    else:
        dst[dst_idx] = moved.to(dst.device)
