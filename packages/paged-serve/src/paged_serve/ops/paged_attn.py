"""The PagedAttention ops (vLLM ``attention/ops/paged_attn.py`` over ``_custom_ops``): argument checks
(``_infra/op_checks.py``), then the Triton kernels on CUDA or the pure-torch reference on CPU.

``PAGED_SERVE_ATTENTION=triton|torch`` forces a backend (read on every call, so it can be flipped at run time);
forcing ``triton`` on CPU tensors needs ``TRITON_INTERPRET=1`` set before triton is imported, which is how the
tests run the kernels without a GPU. ``swap_blocks`` always uses device copies (a copy engine's job, no kernel).
"""

from __future__ import annotations

import os

import torch

from paged_serve._infra import op_checks
from paged_serve.ops import reference

_BACKENDS = ("triton", "torch")
swap_blocks = reference.swap_blocks  # a copy engine's job on every backend (see its docstring)
SUPPORTED_BLOCK_SIZES = op_checks.SUPPORTED_BLOCK_SIZES


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


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the cache slots ``slot_mapping``."""
    op_checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    if _use_triton(key.device):
        from paged_serve.ops.triton_kernels import cache_ops

        slot_mapping = op_checks.kernel_index("slot_mapping", slot_mapping, key.device)
        return cache_ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    return reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale=None, out=None):
    """Decode attention, one query token per sequence; ``scale`` defaults to ``head_size ** -0.5``."""
    op_checks.check_decode(query, key_cache, value_cache, block_tables, context_lens)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if _use_triton(query.device):
        from paged_serve.ops.triton_kernels import decode_attention

        block_tables = op_checks.kernel_index("block_tables", block_tables, query.device)
        context_lens = op_checks.kernel_index("context_lens", context_lens, query.device)
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
    op_checks.check_prefill(query, key_cache, value_cache, block_tables, query_start_loc, context_lens)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if _use_triton(query.device):
        from paged_serve.ops.triton_kernels import prefill_attention

        block_tables = op_checks.kernel_index("block_tables", block_tables, query.device)
        query_start_loc = op_checks.kernel_index("query_start_loc", query_start_loc, query.device)
        context_lens = op_checks.kernel_index("context_lens", context_lens, query.device)
        args = (query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, out)
        return prefill_attention.paged_prefill_attention(*args)
    args = (query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, out)
    return reference.paged_prefill_attention(*args, key=key, value=value)


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Copy-on-write: copy block ``src`` -> ``dst`` in every layer for each ``(src, dst)`` row of ``block_mapping``."""
    op_checks.check_copy_blocks(key_caches, value_caches)
    mapping = torch.as_tensor(block_mapping, dtype=torch.int64).reshape(-1, 2)
    if not key_caches or mapping.numel() == 0:
        return
    if _use_triton(key_caches[0].device):
        from paged_serve.ops.triton_kernels import cache_ops

        return cache_ops.copy_blocks(key_caches, value_caches, mapping)
    return reference.copy_blocks(key_caches, value_caches, mapping)
