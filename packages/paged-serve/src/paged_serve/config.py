"""Engine configuration objects (vLLM ``vllm/config.py``): what the model, the KV cache and the scheduler need.

``LLMEngine`` takes one ``VllmConfig``; vLLM's ``EngineArgs`` (``_compat/arg_utils.py``) builds it from user
arguments. Each config validates itself and names the offending value, so a bad one fails before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_serve._infra.hub import TOKENIZER_FILES, get_model_path, try_get_generation_config

PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class SchedulerConfig:
    """Per-step budgets and policies (vLLM ``SchedulerConfig``; positional order as vLLM's for its tests)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = False
    preemption_mode: str | None = None  # None: recompute single-sequence groups, swap multi-sequence ones
    num_lookahead_slots: int = 0
    delay_factor: float = 0.0  # vLLM's scheduler_delay_factor

    def __post_init__(self):
        if not self.delay_factor >= 0:
            raise ValueError(f"delay_factor must be >= 0, got {self.delay_factor}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_lookahead_slots < 0:
            raise ValueError(f"num_lookahead_slots must be >= 0, got {self.num_lookahead_slots}")
        if self.preemption_mode is not None and self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES} or None, got {self.preemption_mode!r}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_model_len "
                f"({self.max_model_len}): without chunked prefill the longest prompt could never be scheduled; "
                "raise max_num_batched_tokens, lower max_model_len or set enable_chunked_prefill"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence needs a token per step"
            )


@dataclass
class CacheConfig:
    """KV cache geometry (vLLM ``CacheConfig``): block size, how to size the pools, their block counts once known."""

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    swap_space: float = 4.0  # GiB of CPU memory for swapped-out blocks
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = False
    watermark: float = 0.01
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    num_gpu_blocks_override: int | None = None  # an explicit device pool size instead of a memory budget
    num_cpu_blocks_override: int | None = None  # an explicit swap pool size instead of swap_space
    kv_cache_memory_bytes: int | None = None  # a byte budget for the device pool

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        if self.cache_dtype != "auto":
            raise ValueError(f"cache_dtype {self.cache_dtype!r} not supported: only 'auto' (the model's dtype)")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


@dataclass
class ModelConfig:
    """The checkpoint and how to run it (vLLM ``ModelConfig`` and ``DeviceConfig``).

    ``model`` (and ``tokenizer``) may be a directory or a hub name; either way it holds a directory once built
    (``_infra/hub.py``: the hub cache, or a download unless ``HF_HUB_OFFLINE``)."""

    model: str
    tokenizer: str | None = None  # the model's directory unless given
    dtype: str = "auto"
    seed: int = 0
    device: str = "auto"  # CUDA if available, else CPU
    max_logprobs: int = 20
    skip_tokenizer_init: bool = False
    revision: str | None = None  # a branch, tag or commit sha of a hub name
    tokenizer_revision: str | None = None
    download_dir: str | None = None  # a hub cache directory instead of HF_HUB_CACHE
    generation_config: str = "auto"  # "auto": the model's generation_config.json; "vllm": none; or a directory
    override_generation_config: dict | None = None

    def __post_init__(self):
        self.model = get_model_path(self.model, self.revision, self.download_dir)
        if self.tokenizer is not None and not self.skip_tokenizer_init:
            self.tokenizer = get_model_path(self.tokenizer, self.tokenizer_revision, self.download_dir,
                                            TOKENIZER_FILES, probe="tokenizer.json")  # fmt: skip

    def get_diff_sampling_param(self) -> dict:
        """The sampling defaults the generation config sets, ``override_generation_config`` over them, under
        ``SamplingParams``' names (vLLM ``ModelConfig.get_diff_sampling_param``)."""
        config = {}
        if self.generation_config != "vllm":
            source = self.model
            if self.generation_config != "auto":  # a directory or a hub name holding generation_config.json
                source = get_model_path(self.generation_config, None, None, ["*.json"], "generation_config.json")
            config = try_get_generation_config(source)
        config.update(self.override_generation_config or {})
        keys = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
        params = {k: config[k] for k in keys if config.get(k) is not None}
        if "max_new_tokens" in params:  # transformers' max_new_tokens is vLLM's max_tokens
            params["max_tokens"] = params.pop("max_new_tokens")
        return params


@dataclass
class ParallelConfig:
    """How many processes run the model (vLLM ``ParallelConfig``): tensor parallelism over ``tensor_parallel_size``
    ranks, rank 0 the engine's process, the others the multiprocessing executor's workers."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # "mp" when tensor_parallel_size > 1, else "uni"

    def __post_init__(self):
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {self.tensor_parallel_size!r}")
        if self.distributed_executor_backend not in (None, "mp", "uni"):
            raise ValueError(f"distributed_executor_backend must be 'mp' or 'uni', got "
                             f"{self.distributed_executor_backend!r}")  # fmt: skip
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError("distributed_executor_backend='uni' runs one process: tensor_parallel_size must be 1")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def verify_with_hf_config(self, hf_config: dict) -> None:
        """vLLM's ``ModelConfig.verify_with_parallel_config``: the heads split evenly over the ranks; KV heads
        too, or (fewer KV heads than ranks) each KV head replicated on a whole number of ranks."""
        tp = self.tensor_parallel_size
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


@dataclass
class VllmConfig:
    """Everything ``LLMEngine`` is built from (vLLM ``VllmConfig``)."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
