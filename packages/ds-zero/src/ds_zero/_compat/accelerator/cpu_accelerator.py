"""``deepspeed.accelerator.cpu_accelerator``: the host as DeepSpeed's accelerator."""

from __future__ import annotations

import contextlib
import logging
import os

import psutil
import torch

from ds_zero._compat.accelerator.abstract_accelerator import TorchAccelerator

logger = logging.getLogger(__name__)


def _numa_node_count() -> int:
    """NUMA nodes that have cores (DeepSpeed counts ``numactl --hardware``'s; 1 where neither can tell)."""
    root = "/sys/devices/system/node"
    try:
        nodes = [n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return 1
    cpulists = []
    for n in sorted(nodes, key=lambda n: int(n[4:])):
        with open(os.path.join(root, n, "cpulist")) as f:
            cpus = f.read().strip()
        if cpus and (not cpulists or cpulists[-1] != cpus):
            cpulists.append(cpus)
    return max(1, len(cpulists))


class CPU_Accelerator(TorchAccelerator):
    """``deepspeed.accelerator.cpu_accelerator.CPU_Accelerator``: one "device" per local rank, memory figures from
    the process's resident set (peak kept here), gloo for communication."""

    _torch_pins_host_memory = False

    def __init__(self):
        super().__init__()
        self._name = "cpu"
        self._communication_backend_name = "gloo"
        self.max_mem = psutil.Process().memory_info().rss

    def is_synchronized_device(self) -> bool:
        return True

    def device_name(self, device_index=None) -> str:
        return "cpu"

    def device(self, device_index=None):
        return None

    def set_device(self, device_index) -> None:
        return None

    def current_device(self):
        return os.environ.get("LOCAL_RANK", 0)  # a string when set, as DeepSpeed's

    def current_device_name(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        local_size = int(os.environ.get("LOCAL_SIZE", 0))
        return local_size if local_size > 0 else _numa_node_count()

    def synchronize(self, device_index=None) -> None:
        return None

    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def default_generator(self, device_index):
        return torch.default_generator

    @property
    def Stream(self):
        return None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    def default_stream(self, device_index=None):
        return None

    @property
    def Event(self):
        return None

    def empty_cache(self) -> None:
        return None

    def get_rss(self) -> int:
        mem = psutil.Process().memory_info().rss
        self.max_mem = max(self.max_mem, mem)
        return mem

    def reset_rss(self) -> int:
        self.max_mem = psutil.Process().memory_info().rss
        return self.max_mem

    def memory_allocated(self, device_index=None) -> int:
        return self.get_rss()

    def max_memory_allocated(self, device_index=None) -> int:
        self.get_rss()
        return self.max_mem

    def reset_max_memory_allocated(self, device_index=None) -> None:
        self.reset_rss()

    memory_cached = memory_reserved = memory_allocated
    max_memory_cached = max_memory_reserved = max_memory_allocated
    reset_max_memory_cached = reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index=None) -> dict:
        mem = self.get_rss()
        return {"allocated_bytes.all.current": mem, "allocated_bytes.all.peak": self.max_mem}

    def total_memory(self, device_index=None) -> int:
        return psutil.virtual_memory().total

    def available_memory(self, device_index=None) -> int:
        return psutil.virtual_memory().available

    def is_available(self) -> bool:
        return True

    def range_push(self, msg, domain=None, category=None) -> None:
        return None

    def range_pop(self, domain=None) -> None:
        return None

    def lazy_call(self, callback):
        return callback()

    def is_triton_supported(self) -> bool:
        return False

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        """fp16 where oneDNN has fp16 kernels (DeepSpeed's test; None, i.e. falsy, where it answers no)."""
        try:
            return True if torch.ops.mkldnn._is_mkldnn_fp16_supported() else None
        except Exception:
            return False

    def supported_dtypes(self) -> list:
        return [torch.float, torch.bfloat16] + ([torch.float16] if self.is_fp16_supported() else [])

    def create_graph(self):
        return None

    def capture_to_graph(self, graph, pool=None, stream=None):
        return contextlib.nullcontext()

    def replay_graph(self, graph) -> None:
        return None

    BFloat16Tensor = property(lambda self: torch.BFloat16Tensor)
    ByteTensor = property(lambda self: torch.ByteTensor)
    DoubleTensor = property(lambda self: torch.DoubleTensor)
    FloatTensor = property(lambda self: torch.FloatTensor)
    HalfTensor = property(lambda self: torch.HalfTensor)
    IntTensor = property(lambda self: torch.IntTensor)
    LongTensor = property(lambda self: torch.LongTensor)

    def _torch_pin_memory(self, tensor):
        return tensor  # a CPU tensor has no device to be pinned for

    def _torch_empty_pinned(self, tensor, shape):
        return tensor.new_empty(shape)

    def pin_memory(self, tensor, make_copy: bool = True, match_shape: bool = True):
        return tensor

    def on_accelerator(self, tensor) -> bool:
        return str(tensor.device).startswith("cpu")

    def export_envs(self) -> list[str]:
        return []
