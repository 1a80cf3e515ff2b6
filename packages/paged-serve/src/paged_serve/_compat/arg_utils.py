"""vLLM's argument parsing: ``EngineArgs`` (``engine/arg_utils.py``) and ``FlexibleArgumentParser`` (``utils``).

``EngineArgs`` holds every engine argument under vLLM's name, checks it up front and builds the engine's
``VllmConfig`` (``create_engine_config``). The same dataclass backs ``LLM(model, **kwargs)``,
``LLMEngine.from_engine_args`` and the ``paged-serve serve`` command line (``add_cli_args``), so an unknown or
inconsistent argument fails the same way everywhere, naming it, before any weight is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from paged_serve._infra.hub import is_hub_name
from paged_serve.config import (
    PREEMPTION_MODES,
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from paged_serve.model_executor.model_loader import load_hf_config
from paged_serve.ops.paged_attn import SUPPORTED_BLOCK_SIZES

_HELP = {
    "model": "Hugging Face model directory (config.json, safetensors, tokenizer.json) or hub name (org/name)",
    "tokenizer": "tokenizer directory or hub name, if not the model's",
    "dtype": "'auto' (the checkpoint's), 'float32', 'bfloat16' or 'float16'",
    "seed": "seed of the sampler's generator for requests without their own seed",
    "block_size": f"tokens per KV block; one of {SUPPORTED_BLOCK_SIZES} (what the kernels support)",
    "num_gpu_blocks": "KV blocks in the device pool (overrides the memory budget)",
    "num_gpu_blocks_override": "vLLM's name for --num-gpu-blocks",
    "swap_space": "GiB of CPU memory for swapped-out blocks",
    "num_cpu_blocks": "KV blocks in the CPU swap pool (overrides --swap-space)",
    "preemption_mode": f"one of {PREEMPTION_MODES}; default: recompute single sequences, swap groups",
    "enable_prefix_caching": "reuse KV of identical prompt prefixes across requests",
    "enable_chunked_prefill": "split long prompts over steps, batched with decodes",
    "max_num_batched_tokens": "tokens per step (default: max(max_model_len, 2048), or 2048 with chunked prefill)",
    "max_num_seqs": "sequences per step",
    "max_model_len": "context length (default: the model's max_position_embeddings)",
    "gpu_memory_utilization": "fraction of CUDA memory for weights, activations and KV cache",
    "kv_cache_memory_bytes": "bytes for the device KV pool (default on CPU: 4 GiB, vLLM CPU's default)",
    "device": "'auto' (CUDA if available), 'cuda' or 'cpu'",
    "max_logprobs": "largest logprobs a request may ask for",
    "scheduler_delay_factor": "hold new prompts until the oldest has waited this many times the last prompt step",
    "skip_tokenizer_init": "load no tokenizer: prompts are token ids and outputs carry no text",
    "revision": "branch, tag or commit sha of a hub model",
    "tokenizer_revision": "branch, tag or commit sha of a hub tokenizer",
    "download_dir": "hub cache directory to read and download into (default: HF_HUB_CACHE)",
    "generation_config": "'auto' (the model's generation_config.json), 'vllm' (vLLM's defaults) or a directory",
    "override_generation_config": "JSON over the generation config, e.g. '{\"temperature\": 0.5}'",
    "tensor_parallel_size": "ranks the model is split over (worker processes beside this one, vLLM's mp executor)",
    "distributed_executor_backend": "'mp' (worker processes; the default when tensor_parallel_size > 1) or 'uni'",
    "hf_token": "the hub's bearer token for downloads; the flag alone: the saved login (default: HF_TOKEN)",
}


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_gpu_blocks_override: int | None = None
    swap_space: float = 4.0
    num_cpu_blocks: int | None = None
    preemption_mode: str | None = None
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    device: str = "auto"
    max_logprobs: int = 20
    scheduler_delay_factor: float = 0.0
    skip_tokenizer_init: bool = False
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    revision: str | None = None
    tokenizer_revision: str | None = None
    download_dir: str | None = None
    generation_config: str = "auto"
    override_generation_config: dict | None = None
    hf_token: bool | str | None = None

    def __post_init__(self):
        if not (isinstance(self.scheduler_delay_factor, (int, float)) and self.scheduler_delay_factor >= 0):
            raise ValueError(f"scheduler_delay_factor must be a number >= 0, got {self.scheduler_delay_factor!r}")
        for name in ("model", "tokenizer"):
            value = getattr(self, name)
            if value is not None and not Path(value).is_dir() and not is_hub_name(value):
                raise ValueError(f"{name} {value!r} is not a directory and not a Hugging Face hub name ('org/name')")
        if self.override_generation_config is not None and not isinstance(self.override_generation_config, dict):
            raise ValueError(f"override_generation_config must be a dict, got {self.override_generation_config!r}")
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(
                f"block_size {self.block_size} not supported by the kernels; use one of {SUPPORTED_BLOCK_SIZES}"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks_override is not None:
            if self.num_gpu_blocks != self.num_gpu_blocks_override:
                raise ValueError(
                    f"num_gpu_blocks={self.num_gpu_blocks} and num_gpu_blocks_override={self.num_gpu_blocks_override} "
                    "disagree: give one"
                )
        for name in ("num_gpu_blocks", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        CacheConfig(self.block_size, self.gpu_memory_utilization, self.swap_space)  # checks those three
        ParallelConfig(self.tensor_parallel_size, self.distributed_executor_backend)
        if self.preemption_mode is not None and self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")

    @classmethod
    def from_kwargs(cls, model: str, **kwargs) -> EngineArgs:
        """``EngineArgs(model, **kwargs)`` with an error that lists the valid names for an unknown one."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; valid: {sorted(names - {'model'})}")
        return cls(model=model, **kwargs)

    @property
    def gpu_blocks(self) -> int | None:
        return self.num_gpu_blocks if self.num_gpu_blocks is not None else self.num_gpu_blocks_override

    def create_engine_config(self) -> VllmConfig:
        """The engine's configs; the context length defaults to the checkpoint's (config.json is read here)."""
        model = ModelConfig(self.model, self.tokenizer, self.dtype, self.seed, self.device, self.max_logprobs,
                            self.skip_tokenizer_init, self.revision, self.tokenizer_revision, self.download_dir,
                            self.generation_config, self.override_generation_config, self.hf_token)  # fmt: skip
        hf_config = load_hf_config(model.model)  # a hub name is a local snapshot directory by now
        model_max_len = hf_config.get("max_position_embeddings") or hf_config.get("n_positions") or 2048
        cache = CacheConfig(
            self.block_size,
            self.gpu_memory_utilization,
            self.swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
            num_gpu_blocks_override=self.gpu_blocks,
            num_cpu_blocks_override=self.num_cpu_blocks,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
        )
        parallel = ParallelConfig(self.tensor_parallel_size, self.distributed_executor_backend)
        parallel.verify_with_hf_config(hf_config)  # before any worker starts
        return VllmConfig(model, cache, self.create_scheduler_config(model_max_len), parallel)

    def create_scheduler_config(self, model_max_len: int) -> SchedulerConfig:
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(f"max_model_len={max_len} exceeds the model's max_position_embeddings ({model_max_len})")
        tokens = self.max_num_batched_tokens
        if tokens is None:
            tokens = 2048 if self.enable_chunked_prefill else max(max_len, 2048)
        return SchedulerConfig(
            max_num_batched_tokens=max(tokens, self.max_num_seqs) if self.max_num_batched_tokens is None else tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            preemption_mode=self.preemption_mode,
            delay_factor=self.scheduler_delay_factor,
        )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Every engine argument as a ``--flag``; ``--model`` too unless the parser already takes a model (as
        ``paged-serve serve MODEL`` does), so vLLM's ``llm_engine_example.py`` parses ``--model DIR``."""
        if not any(a.dest == "model" for a in parser._actions):
            parser.add_argument("--model", default="facebook/opt-125m", help=_HELP["model"])
        for f in fields(EngineArgs):
            if f.name == "model":
                continue
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.name == "hf_token":  # vLLM's: a token, or the flag alone for the saved login (True)
                parser.add_argument(flag, type=str, nargs="?", const=True, default=None, help=_HELP[f.name])
                continue
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=_HELP[f.name])
                continue
            kind = {"int": int, "float": float, "dict": json.loads}.get(str(f.type).split(" ")[0], str)
            parser.add_argument(flag, type=kind, default=default, help=_HELP[f.name])
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's scripts build their command lines with it; underscores in a long option become dashes."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        fixed = []
        for arg in args:
            if arg.startswith("--") and "_" in arg:
                name, eq, value = arg.partition("=")
                arg = name.replace("_", "-") + eq + value
            fixed.append(arg)
        return super().parse_args(fixed, namespace)
