"""``deepspeed.accelerator.cuda_accelerator``: ``torch.cuda`` as DeepSpeed's accelerator."""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch

from ds_zero._compat.accelerator.abstract_accelerator import TorchAccelerator

logger = logging.getLogger(__name__)


def _cuda_tensor(dtype):
    return functools.partial(torch.tensor, dtype=dtype, device="cuda")


class CUDA_Accelerator(TorchAccelerator):
    """``deepspeed.accelerator.cuda_accelerator.CUDA_Accelerator``: each method is its ``torch.cuda`` call."""

    supports_nvtx_domain = True

    def __init__(self):
        super().__init__()
        self._name = "cuda"
        self._communication_backend_name = "nccl" if sys.platform != "win32" else "gloo"

    def is_synchronized_device(self) -> bool:
        return False

    def device_name(self, device_index=None) -> str:
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index=None):
        return torch.device("cuda", device_index)

    def set_device(self, device_index) -> None:
        torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def communication_backend_version(self):
        return torch.cuda.nccl.version()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed()

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    @property
    def Stream(self):
        return torch.cuda.Stream

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self):
        return torch.cuda.Event

    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None) -> int:
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None) -> int:
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        return torch.cuda.reset_max_memory_allocated(device_index)

    def memory_cached(self, device_index=None) -> int:
        return torch.cuda.memory_reserved(device_index)

    def max_memory_cached(self, device_index=None) -> int:
        return torch.cuda.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index=None) -> dict:
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None) -> int:
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None) -> int:
        return torch.cuda.max_memory_reserved(device_index)

    def total_memory(self, device_index=None) -> int:
        return torch.cuda.get_device_properties(device_index).total_memory

    def available_memory(self, device_index=None) -> int:
        return torch.cuda.mem_get_info(device_index)[0]

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def range_push(self, msg, domain=None, category=None):
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None):
        return torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)

    def is_triton_supported(self) -> bool:
        return self.is_available() and torch.cuda.get_device_capability()[0] >= 8

    def is_bf16_supported(self) -> bool:
        return True if not torch.cuda.is_available() else torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        if not torch.cuda.is_available():
            return True
        major, _ = torch.cuda.get_device_capability()
        return major >= 7 or (major == 6 and os.environ.get("DS_ALLOW_DEPRECATED_FP16", "0") == "1")

    def is_current_stream_capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def create_graph(self):
        return torch.cuda.CUDAGraph()

    def capture_to_graph(self, graph, pool=None, stream=None):
        return torch.cuda.graph(graph, pool, stream)

    def replay_graph(self, graph) -> None:
        graph.replay()

    BFloat16Tensor = property(lambda self: _cuda_tensor(torch.bfloat16))
    ByteTensor = property(lambda self: _cuda_tensor(torch.uint8))
    DoubleTensor = property(lambda self: _cuda_tensor(torch.double))
    FloatTensor = property(lambda self: _cuda_tensor(torch.float))
    HalfTensor = property(lambda self: _cuda_tensor(torch.half))
    IntTensor = property(lambda self: _cuda_tensor(torch.int))
    LongTensor = property(lambda self: _cuda_tensor(torch.long))

    def on_accelerator(self, tensor) -> bool:
        return str(tensor.device).startswith("cuda:")

    def export_envs(self) -> list[str]:
        return ["NCCL"]
