"""``Worker`` (vLLM ``worker/worker.py``): one rank's slice of the model, its KV cache and its model runner.

Every rank builds the same ``Worker``: it joins the tensor-parallel group, loads its slice of the checkpoint (the
layers' weight loaders cut it), sizes its KV cache with as many blocks as every rank can hold (the minimum over
the ranks, as vLLM's executor takes it after profiling) and then runs each step's ``ExecuteModelRequest``: the
scheduler's swaps and copies on its cache, then the forward pass. Only the driver (rank 0) gets logits back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from paged_serve.config import VllmConfig
from paged_serve.distributed.parallel_state import (
    GroupCoordinator,
    get_tp_group,
    init_distributed_environment,
    use_tp_group,
)
from paged_serve.model_executor.model_loader import get_model, load_hf_config, resolve_dtype
from paged_serve.worker.kv_budget import initialize_kv_cache
from paged_serve.worker.model_runner import ModelInput, ModelRunner


@dataclass
class ExecuteModelRequest:
    """One step for every rank (vLLM ``ExecuteModelRequest``): cache moves, then the packed batch, if any."""

    blocks_to_swap_in: list[tuple[int, int]]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_copy: list[tuple[int, int]]
    model_input: ModelInput | None = None


def _device(name: str, rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    return torch.device("cuda", rank) if name == "cuda" else torch.device(name)


class Worker:
    def __init__(self, vllm_config: VllmConfig, rank: int = 0, distributed_init_method: str | None = None):
        self.vllm_config, self.rank, self.distributed_init_method = vllm_config, rank, distributed_init_method
        model_config = vllm_config.model_config
        self.device = _device(model_config.device, rank)
        self.hf_config = load_hf_config(model_config.model)
        self.dtype = resolve_dtype(model_config.dtype, self.hf_config)

    def init_device(self) -> None:
        world_size = self.vllm_config.parallel_config.world_size
        if world_size > 1:
            if self.device.type == "cpu":  # the ranks share the cores (vLLM's CPU workers bind theirs)
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
            init_distributed_environment(world_size, self.rank, self.distributed_init_method, self.device)
        self.tp_group = get_tp_group() if world_size > 1 else GroupCoordinator()

    def load_model(self) -> None:
        with use_tp_group(self.tp_group):
            self.model = get_model(self.vllm_config.model_config.model, self.dtype, self.device, self.hf_config)

    def initialize_cache(self) -> None:
        cache, scheduler = self.vllm_config.cache_config, self.vllm_config.scheduler_config
        num_layers = self.hf_config.get("num_hidden_layers") or self.hf_config["n_layer"]
        self.cache_engine = initialize_kv_cache(cache, scheduler, self.model, num_layers, self.dtype, self.device,
                                                self.tp_group)  # fmt: skip
        self.model_runner = ModelRunner(self.model, cache.block_size, self.device)

    def execute_model(self, request: ExecuteModelRequest) -> torch.Tensor | None:
        self.cache_engine.swap_out(request.blocks_to_swap_out)
        self.cache_engine.swap_in(request.blocks_to_swap_in)
        self.cache_engine.copy(request.blocks_to_copy)
        if request.model_input is None:
            return None
        return self.model_runner.execute_model(request.model_input, self.cache_engine.gpu_cache)
