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
    ``num_kv_heads``. Batched: every sequence's slots are gathered into a padded ``[num_seqs, max_len]`` view and
    the padding masked, so the cost is one gather plus two batched matmuls, computed in fp32.
    """
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    lens = context_lens.to(device=query.device, dtype=torch.long)
    max_len = int(lens.max()) if num_seqs else 0
    pos = torch.arange(max_len, device=query.device)
    pad = pos[None, :] >= lens[:, None]
    # Per-token slots; padding positions re-read token 0 of the sequence (always written, so finite) and are
    # masked out of the softmax. Stale slots of the cache (torch.empty garbage, NaN) are therefore never read.
    pos = torch.where(pad, 0, pos[None, :])
    blocks = block_tables.to(device=query.device, dtype=torch.long).gather(1, pos // block_size)
    slots = blocks * block_size + pos % block_size
    # gather rows of a [slots * kv_heads, head_size] view straight into [num_seqs, num_kv_heads, max_len, head_size]
    # so the matmuls below see contiguous operands (a strided batched matmul is several times slower on CPU)
    rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=query.device)[None, :, None]
    k = key_cache.reshape(-1, head_size)[rows].float()
    v = value_cache.reshape(-1, head_size)[rows].float()
    q = query.float().reshape(num_seqs, num_kv_heads, group, head_size)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [num_seqs, num_kv_heads, group, max_len]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    result = torch.matmul(probs, v).masked_fill((lens == 0)[:, None, None, None], 0.0)  # empty context: zeros
    result = result.reshape(num_seqs, num_heads, head_size)
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
    group = num_heads // num_kv_heads
    result = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s, ctx in enumerate(lens):
        q = query[starts[s] : starts[s + 1]].float()
        q_len = q.shape[0]
        if q_len == 0:
            continue
        # GQA without repeating K/V: fold each kv head's group of query heads into the matmul's rows
        q = q.reshape(q_len, num_kv_heads, group, head_size).permute(1, 2, 0, 3).reshape(num_kv_heads, -1, head_size)
        k = gather_kv(key_cache, block_tables[s], ctx).float().transpose(0, 1).contiguous()  # [kv_heads, ctx, D]
        v = gather_kv(value_cache, block_tables[s], ctx).float().transpose(0, 1).contiguous()
        scores = torch.matmul(q, k.transpose(1, 2)).view(num_kv_heads, group, q_len, ctx) * scale
        q_pos = torch.arange(ctx - q_len, ctx, device=query.device)
        future = torch.arange(ctx, device=query.device)[None, :] > q_pos[:, None]
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        o = torch.matmul(probs.view(num_kv_heads, -1, ctx), v).view(num_kv_heads, group, q_len, head_size)
        result[starts[s] : starts[s + 1]] = o.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_size)
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
