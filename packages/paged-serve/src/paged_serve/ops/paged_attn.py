"""The PagedAttention ops (vLLM ``attention/ops/paged_attn.py`` over ``_custom_ops``): argument checks, then the
Triton kernels on CUDA or the pure-torch reference on CPU.

``PAGED_SERVE_ATTENTION=triton|torch`` forces a backend (read on every call, so it can be flipped at run time);
forcing ``triton`` on CPU tensors needs ``TRITON_INTERPRET=1`` set before triton is imported, which is how the
tests run the kernels without a GPU. ``swap_blocks`` always uses device copies (a copy engine's job, no kernel).
"""

from __future__ import annotations

import os

import torch

from paged_serve.ops import reference

_BACKENDS = ("triton", "torch")
swap_blocks = reference.swap_blocks  # a copy engine's job on every backend (see its docstring)
SUPPORTED_BLOCK_SIZES = (8, 16, 32)


def get_backend(device: torch.device | str) -> str:
    """The backend the ops use for tensors on ``device``: the env override, else triton on CUDA, torch elsewhere."""
    forced = os.environ.get("PAGED_SERVE_ATTENTION", "").strip().lower()
    if forced:
        if forced not in _BACKENDS:
            raise ValueError(f"PAGED_SERVE_ATTENTION={forced!r}: expected one of {_BACKENDS}")
        return forced
    return "triton" if torch.device(device).type == "cuda" else "torch"


def _use_triton(device: torch.device) -> bool:
    if get_backend(device) != "triton":
        return False
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"PAGED_SERVE_ATTENTION=triton with tensors on {device}: Triton kernels run on CUDA, or on CPU only "
            "in the interpreter (TRITON_INTERPRET=1 set before triton is imported)"
        )
    return True


def _check_index(name: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")


def _kernel_index(name: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An index tensor as the Triton kernels read it: on the data's device, contiguous (a kernel walks its rows
    with unit stride; a strided view would be read as if packed)."""
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the tensors it indexes are on {device}")
    return t.contiguous()


def _check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_size], got shape {tuple(key_cache.shape)}"
        )
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} differ")
    block_size = key_cache.shape[1]
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} not supported; use one of {SUPPORTED_BLOCK_SIZES}")


def _check_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    _check_cache(key_cache, value_cache)
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


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the cache slots ``slot_mapping``."""
    _check_cache(key_cache, value_cache)
    if key.shape != value.shape or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match cache heads {tuple(key_cache.shape[2:])}"
        )
    if slot_mapping.shape != key.shape[:1]:
        raise ValueError(f"slot_mapping shape {tuple(slot_mapping.shape)} != ({key.shape[0]},)")
    _check_index("slot_mapping", slot_mapping)
    if _use_triton(key.device):
        from paged_serve.ops.triton_kernels import cache_ops

        slot_mapping = _kernel_index("slot_mapping", slot_mapping, key.device)
        return cache_ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    return reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale=None, out=None):
    """Decode attention, one query token per sequence; ``scale`` defaults to ``head_size ** -0.5``."""
    _check_attention(query, key_cache, value_cache)
    if block_tables.dim() != 2 or block_tables.shape[0] != query.shape[0] or context_lens.shape != query.shape[:1]:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
            f"do not match {query.shape[0]} sequences"
        )
    _check_index("block_tables", block_tables)
    _check_index("context_lens", context_lens)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if _use_triton(query.device):
        from paged_serve.ops.triton_kernels import decode_attention

        block_tables = _kernel_index("block_tables", block_tables, query.device)
        context_lens = _kernel_index("context_lens", context_lens, query.device)
        return decode_attention.paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale, out)
    return reference.paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale, out)


def paged_prefill_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    query_start_loc,
    context_lens,
    scale=None,
    out=None,
    key=None,
    value=None,
):
    """Prefill / chunked prefill with a causal mask; new tokens packed, ``query_start_loc`` = cu_seqlens.

    ``key``/``value``: the new tokens' K/V, packed like ``query`` (optional). On the torch path a sequence with no
    cached context then attends over them directly instead of reading back what was just written (vLLM's
    flash-attention backend does the same for prompts without a prefix hit); the Triton kernel always reads the
    cache.
    """
    _check_attention(query, key_cache, value_cache)
    num_seqs = query_start_loc.shape[0] - 1
    if block_tables.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
            f"do not match {num_seqs} sequences from query_start_loc"
        )
    for name, t in (
        ("block_tables", block_tables),
        ("query_start_loc", query_start_loc),
        ("context_lens", context_lens),
    ):
        _check_index(name, t)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if _use_triton(query.device):
        from paged_serve.ops.triton_kernels import prefill_attention

        block_tables = _kernel_index("block_tables", block_tables, query.device)
        query_start_loc = _kernel_index("query_start_loc", query_start_loc, query.device)
        context_lens = _kernel_index("context_lens", context_lens, query.device)
        args = (query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, out)
        return prefill_attention.paged_prefill_attention(*args)
    args = (query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, out)
    return reference.paged_prefill_attention(*args, key=key, value=value)


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Copy-on-write: copy block ``src`` -> ``dst`` in every layer for each ``(src, dst)`` row of ``block_mapping``."""
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    mapping = torch.as_tensor(block_mapping, dtype=torch.int64).reshape(-1, 2)
    if not key_caches or mapping.numel() == 0:
        return
    if _use_triton(key_caches[0].device):
        from paged_serve.ops.triton_kernels import cache_ops

        return cache_ops.copy_blocks(key_caches, value_caches, mapping)
    return reference.copy_blocks(key_caches, value_caches, mapping)
