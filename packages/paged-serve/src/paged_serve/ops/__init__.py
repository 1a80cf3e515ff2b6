"""PagedAttention ops with backend dispatch (``ops/paged_attn.py``): Triton kernels (``ops/triton_kernels/``) on
CUDA, the pure-torch reference (``ops/reference.py``) on CPU."""

from paged_serve.ops import reference
from paged_serve.ops.paged_attn import (
    SUPPORTED_BLOCK_SIZES,
    copy_blocks,
    get_backend,
    paged_attention,
    paged_prefill_attention,
    reshape_and_cache,
    swap_blocks,
)
from paged_serve.ops.reference import gather_kv

__all__ = [
    "SUPPORTED_BLOCK_SIZES",
    "copy_blocks",
    "gather_kv",
    "get_backend",
    "paged_attention",
    "paged_prefill_attention",
    "reference",
    "reshape_and_cache",
    "swap_blocks",
]
