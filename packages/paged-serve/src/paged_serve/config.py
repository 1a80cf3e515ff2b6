"""Engine configuration objects (vLLM ``vllm/config.py``): what the model, the KV cache and the scheduler need.

``LLMEngine`` takes one ``VllmConfig``; vLLM's ``EngineArgs`` (``_compat/arg_utils.py``) builds it from user
arguments. Each config validates itself and names the offending value, so a bad one fails before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_serve._infra import config_checks
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
        config_checks.check_scheduler_config(self, PREEMPTION_MODES)


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
        config_checks.check_cache_config(self)


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
    hf_token: bool | str | None = None  # the hub's bearer token (True: the saved login), for downloads

    def __post_init__(self):
        if self.tokenizer is None and self.tokenizer_revision is not None:  # the model's repo, at that revision
            self.tokenizer = self.model
        self.model = get_model_path(self.model, self.revision, self.download_dir, token=self.hf_token)
        if self.tokenizer is not None and not self.skip_tokenizer_init:
            self.tokenizer = get_model_path(self.tokenizer, self.tokenizer_revision, self.download_dir,
                                            TOKENIZER_FILES, "tokenizer.json", self.hf_token)  # fmt: skip

    def get_diff_sampling_param(self) -> dict:
        """The sampling defaults the generation config sets, ``override_generation_config`` over them, under
        ``SamplingParams``' names (vLLM ``ModelConfig.get_diff_sampling_param``)."""
        config = {}
        if self.generation_config != "vllm":
            source = self.model
            if self.generation_config != "auto":  # a directory or a hub name holding generation_config.json
                source = get_model_path(self.generation_config, None, None, ["*.json"], "generation_config.json",
                                        self.hf_token)  # fmt: skip
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
        config_checks.check_parallel_config(self)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def verify_with_hf_config(self, hf_config: dict) -> None:
        """vLLM's ``ModelConfig.verify_with_parallel_config``: the heads split evenly over the ranks; KV heads
        too, or (fewer KV heads than ranks) each KV head replicated on a whole number of ranks."""
        config_checks.check_tp_divides(hf_config, self.tensor_parallel_size)


@dataclass
class VllmConfig:
    """Everything ``LLMEngine`` is built from (vLLM ``VllmConfig``)."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
