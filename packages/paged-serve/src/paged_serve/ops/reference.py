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
    ``num_kv_heads``. Batched: the block tables are gathered into a padded ``[num_seqs, max_len]`` view and the
    padding masked, so the cost is one gather plus two batched matmuls, computed in fp32.
    """
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    lens = context_lens.to(torch.long)
    max_len = int(lens.max()) if num_seqs else 0
    max_blocks = -(-max_len // block_size)
    # table entries past a sequence's length may hold anything: clamp them to a valid block, mask the tokens
    tables = block_tables[:, :max_blocks].to(torch.long).clamp(0, key_cache.shape[0] - 1)
    pad = torch.arange(max_len, device=query.device)[None, :] >= lens[:, None]
    # [num_seqs, max_blocks * block_size, num_kv_heads, head_size]; masked rows zeroed so stale NaNs cannot leak
    k = key_cache[tables].flatten(1, 2)[:, :max_len].float().masked_fill(pad[:, :, None, None], 0.0)
    v = value_cache[tables].flatten(1, 2)[:, :max_len].float().masked_fill(pad[:, :, None, None], 0.0)
    q = query.float().view(num_seqs, num_kv_heads, group, head_size)
    scores = torch.einsum("skgd,stkd->skgt", q, k) * scale
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a zero-length context gives zeros, not NaN
    result = torch.einsum("skgt,stkd->skgd", probs, v).reshape(num_seqs, num_heads, head_size)
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
        k = gather_kv(key_cache, block_tables[s], ctx).float().repeat_interleave(group, dim=1)
        v = gather_kv(value_cache, block_tables[s], ctx).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(ctx - q_len, ctx, device=query.device)
        future = torch.arange(ctx, device=query.device)[None, :] > q_pos[:, None]
        scores = scores.masked_fill(future[None], float("-inf"))
        result[starts[s] : starts[s + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
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
        moved = moved.pin_memory()
    dst[dst_idx] = moved.to(dst.device, non_blocking=True)
