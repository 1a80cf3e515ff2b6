"""DeepSpeed's accelerator abstraction (``deepspeed/accelerator/``): one object that answers device, RNG, stream,
memory, dtype and op-builder questions, so scripts written as ``get_accelerator().device_name()`` run on any device.
Here for the two devices ds_zero trains on: ``cpu`` (DeepSpeed's ``CPU_Accelerator``: host memory is the process's
RSS, no streams, pinning a no-op) and ``cuda`` (``CUDA_Accelerator``: ``torch.cuda``). ``get_accelerator`` picks as
DeepSpeed's ``real_accelerator.py`` does: ``DS_ACCELERATOR`` if set, else CUDA when a device is visible, else cpu."""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import os
import sys

import psutil
import torch

from ds_zero._infra import op_builder

logger = logging.getLogger(__name__)

# DeepSpeed's list; ds_zero builds the first two and refuses the others by name.
SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu"]
_BUILT = ("cuda", "cpu")


class NotImplementedBuilder(op_builder.OpBuilder):
    """What ``get_op_builder`` gives for an op ds_zero does not build: refused by name at ``load()``, as
    DeepSpeed's ``NotImplementedBuilder``."""

    NAME = "deepspeed_not_implemented"

    def __init__(self, name: str | None = None):
        self.name = self.NAME if name is None else name

    def is_compatible(self, verbose: bool = False) -> bool:
        return False

    def load(self, verbose: bool = True):
        raise ValueError(f"op {self.name!r} is not implemented in ds_zero (it builds {sorted(_OP_BUILDERS)})")


_OP_BUILDERS = {"CPUAdamBuilder": op_builder.CPUAdamBuilder}


class DeepSpeedAccelerator(abc.ABC):
    """``deepspeed.accelerator.abstract_accelerator.DeepSpeedAccelerator``: the interface, and the parts every device
    shares (op builders, pinning helpers, visible-devices variables, compile backend)."""

    supports_nvtx_domain = False
    _torch_pins_host_memory = True

    def __init__(self):
        self._name = None
        self._communication_backend_name = None
        self._compile_backend = "inductor"

    # what each device must answer itself (DeepSpeed declares more of its interface abstract; the rest is shared)
    @abc.abstractmethod
    def is_synchronized_device(self) -> bool: ...

    @abc.abstractmethod
    def device_name(self, device_index=None) -> str: ...

    @abc.abstractmethod
    def current_device_name(self) -> str: ...

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def synchronize(self, device_index=None): ...

    @abc.abstractmethod
    def manual_seed(self, seed): ...

    @abc.abstractmethod
    def memory_allocated(self, device_index=None) -> int: ...

    @abc.abstractmethod
    def is_bf16_supported(self) -> bool: ...

    @abc.abstractmethod
    def is_fp16_supported(self) -> bool: ...

    @abc.abstractmethod
    def is_available(self) -> bool: ...

    @abc.abstractmethod
    def on_accelerator(self, tensor) -> bool: ...

    def is_fp64_supported(self) -> bool:
        return True

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def random(self):
        return torch.random

    def prefer_triton_grouped_mm(self) -> bool:
        return False

    def is_current_stream_capturing(self) -> bool:
        return False

    def supported_dtypes(self) -> list:
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

    # --- host memory pinning (torch's own; DeepSpeed's native pinning backend is not built here) ---------------
    def _torch_pin_memory(self, tensor):
        return tensor.pin_memory()

    def _torch_empty_pinned(self, tensor, shape):
        return tensor.new_empty(shape, pin_memory=True)

    def pin_memory(self, tensor, make_copy: bool = True, match_shape: bool = True):
        if make_copy:
            return self._torch_pin_memory(tensor)
        return self._torch_empty_pinned(tensor, tensor.shape if match_shape else (tensor.numel(),))

    def pin_empty(self, *size, dtype, device="cpu"):
        _require_host(device)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return self._torch_empty_pinned(torch.empty(0, dtype=dtype), tuple(shape))

    def pin_empty_like(self, tensor, device="cpu", dtype=None):
        _require_host(device)
        template = tensor.new_empty((0,), dtype=tensor.dtype if dtype is None else dtype, device=device)
        return self._torch_empty_pinned(template, tuple(tensor.shape))

    def is_pinned(self, tensor) -> bool:
        return tensor.is_pinned()

    def unpin_memory(self, tensor):
        return None

    def register_host_memory(self, address, num_bytes) -> bool:
        return False

    def unregister_host_memory(self, address):
        return None

    def pin_memory_alignment(self) -> int:
        return 1

    # --- ops, environment, compile --------------------------------------------------------------------------
    def op_builder_dir(self) -> str:
        return "ds_zero.ops.op_builder"

    def get_op_builder(self, class_name: str):
        return _OP_BUILDERS.get(class_name, NotImplementedBuilder)

    def create_op_builder(self, class_name: str):
        builder = self.get_op_builder(class_name)
        return builder(class_name) if builder is NotImplementedBuilder else builder()

    def build_extension(self):
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: dict, local_accelerator_ids) -> None:
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        supported = torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(f"{backend} not supported by {self.device_name()}. Supported Backends are {supported}")
        self._compile_backend = backend


def _require_host(device) -> None:
    try:
        ok = torch.device(device).type == "cpu"
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")


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


class CPU_Accelerator(DeepSpeedAccelerator):
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


def _cuda_tensor(dtype):
    return functools.partial(torch.tensor, dtype=dtype, device="cuda")


class CUDA_Accelerator(DeepSpeedAccelerator):
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


ds_accelerator: DeepSpeedAccelerator | None = None


def _validate_accelerator(accel_obj) -> None:
    if not isinstance(accel_obj, DeepSpeedAccelerator):
        raise AssertionError(f"{accel_obj.__class__.__name__} accelerator is not subclass of DeepSpeedAccelerator")


def get_accelerator() -> DeepSpeedAccelerator:
    """The process's accelerator, chosen once: ``DS_ACCELERATOR``, else ``cuda`` when a CUDA device is visible,
    else ``cpu`` (DeepSpeed's ``real_accelerator.get_accelerator``)."""
    global ds_accelerator
    if ds_accelerator is not None:
        return ds_accelerator
    name = os.environ.get("DS_ACCELERATOR")
    how = "override"
    if name is not None and name not in SUPPORTED_ACCELERATOR_LIST:
        raise ValueError(f"DS_ACCELERATOR must be one of {SUPPORTED_ACCELERATOR_LIST}. Value \"{name}\" is not "
                         "supported")
    if name is not None and name not in _BUILT:
        raise ValueError(f"DS_ACCELERATOR={name!r}: ds_zero implements the {list(_BUILT)} accelerators only")
    if name is None:
        how = "auto detect"
        if torch.cuda.device_count() > 0 and torch.cuda.is_available():
            name = "cuda"
        else:
            logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to "
                           "detect it.")
            name = "cpu"
    ds_accelerator = CUDA_Accelerator() if name == "cuda" else CPU_Accelerator()
    logger.info("Setting ds_accelerator to %s (%s)", name, how)
    return ds_accelerator


def set_accelerator(accel_obj: DeepSpeedAccelerator) -> None:
    global ds_accelerator
    _validate_accelerator(accel_obj)
    ds_accelerator = accel_obj


def is_current_accelerator_supported() -> bool:
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST
