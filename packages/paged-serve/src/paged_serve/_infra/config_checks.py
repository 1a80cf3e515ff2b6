"""The range checks of the engine's configs (``config.py``: ``SchedulerConfig``, ``CacheConfig``,
``ParallelConfig``), each called once from the config's ``__post_init__``, and of what the checkpoint and the KV
budget allow (``model_loader.py``, ``worker/kv_budget.py``): a bad value raises ``ValueError`` naming it."""

from __future__ import annotations


def check_scheduler_config(config, preemption_modes: tuple[str, ...]) -> None:
    if not config.delay_factor >= 0:
        raise ValueError(f"delay_factor must be >= 0, got {config.delay_factor}")
    for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.num_lookahead_slots < 0:
        raise ValueError(f"num_lookahead_slots must be >= 0, got {config.num_lookahead_slots}")
    if config.preemption_mode is not None and config.preemption_mode not in preemption_modes:
        raise ValueError(f"preemption_mode must be one of {preemption_modes} or None, got {config.preemption_mode!r}")
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) is smaller than max_model_len "
            f"({config.max_model_len}): without chunked prefill the longest prompt could never be scheduled; "
            "raise max_num_batched_tokens, lower max_model_len or set enable_chunked_prefill"
        )
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= max_num_seqs "
            f"({config.max_num_seqs}): every running sequence needs a token per step"
        )


def check_cache_config(config) -> None:
    if config.block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {config.block_size}")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {config.gpu_memory_utilization}")
    if config.swap_space < 0:
        raise ValueError(f"swap_space must be >= 0 GiB, got {config.swap_space}")
    if config.cache_dtype != "auto":
        raise ValueError(f"cache_dtype {config.cache_dtype!r} not supported: only 'auto' (the model's dtype)")
    if not 0.0 <= config.watermark < 1.0:
        raise ValueError(f"watermark must be in [0, 1), got {config.watermark}")


def check_parallel_config(config) -> None:
    if not isinstance(config.tensor_parallel_size, int) or config.tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {config.tensor_parallel_size!r}")
    if config.distributed_executor_backend not in (None, "mp", "uni"):
        raise ValueError(f"distributed_executor_backend must be 'mp' or 'uni', got "
                         f"{config.distributed_executor_backend!r}")  # fmt: skip
    if config.distributed_executor_backend == "uni" and config.tensor_parallel_size > 1:
        raise ValueError("distributed_executor_backend='uni' runs one process: tensor_parallel_size must be 1")


def check_tp_divides(hf_config: dict, tp: int) -> None:
    heads = hf_config.get("num_attention_heads") or hf_config.get("n_head")
    kv_heads = hf_config.get("num_key_value_heads") or heads
    if heads % tp:
        raise ValueError(f"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                         f"({tp}).")  # fmt: skip
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        raise ValueError(f"Total number of key/value heads ({kv_heads}) and tensor parallel size ({tp}): one "
                         "must divide the other.")  # fmt: skip
    inter = hf_config.get("intermediate_size") or hf_config.get("ffn_dim") or hf_config.get("n_inner")
    if inter and inter % tp:
        raise ValueError(f"intermediate size ({inter}) must be divisible by tensor parallel size ({tp}).")


def check_hf_config(config: dict) -> None:
    """What a checkpoint's config.json may ask that the attention kernels cannot do."""
    if config.get("sliding_window") not in (None, 0) and config.get("use_sliding_window", True):
        if config["sliding_window"] < config.get("max_position_embeddings", 0):
            raise ValueError(f"sliding_window={config['sliding_window']} attention is not supported")


def check_kv_budget(num_gpu_blocks: int, budget: int, block_bytes: int) -> None:
    if num_gpu_blocks < 1:
        raise ValueError(
            f"no memory left for the KV cache ({budget} bytes for {block_bytes}-byte blocks): raise "
            "gpu_memory_utilization / kv_cache_memory_bytes or use a smaller model"
        )


def check_kv_holds_a_sequence(num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
    if num_gpu_blocks * block_size < max_model_len:
        raise ValueError(
            f"max_model_len ({max_model_len}) is larger than the KV cache holds ({num_gpu_blocks} blocks x "
            f"{block_size} tokens): lower max_model_len or give the cache more blocks / memory"
        )
