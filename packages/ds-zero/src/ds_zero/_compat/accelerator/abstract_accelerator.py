"""DeepSpeed's accelerator abstraction (``deepspeed/accelerator/``): one object that answers device, RNG, stream,
memory, dtype and op-builder questions, so scripts written as ``get_accelerator().device_name()`` run on any device.
Here for the two devices ds_zero trains on: ``cpu`` (DeepSpeed's ``CPU_Accelerator``: host memory is the process's
RSS, no streams, pinning a no-op) and ``cuda`` (``CUDA_Accelerator``: ``torch.cuda``). ``get_accelerator`` picks as
DeepSpeed's ``real_accelerator.py`` does: ``DS_ACCELERATOR`` if set, else CUDA when a device is visible, else cpu."""

from __future__ import annotations

import abc
import logging

import torch

from ds_zero._infra import op_builder

logger = logging.getLogger(__name__)


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


def _require_host(device) -> None:
    try:
        ok = torch.device(device).type == "cpu"
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")


class DeepSpeedAccelerator(abc.ABC):
    """``deepspeed.accelerator.abstract_accelerator.DeepSpeedAccelerator``: the interface, abstract where DeepSpeed's
    is (a subclass that leaves a method out cannot be instantiated: Python's TypeError names it), with DeepSpeed's
    concrete host-pinning helpers."""

    supports_nvtx_domain = False
    _torch_pins_host_memory = True

    def __init__(self):
        self._name = None
        self._communication_backend_name = None
        self._compile_backend = None

    @abc.abstractmethod
    def is_synchronized_device(self): ...

    @abc.abstractmethod
    def use_host_timers(self): ...

    @abc.abstractmethod
    def resolves_data_dependency(self): ...

    @abc.abstractmethod
    def handles_memory_backpressure(self): ...

    # device
    @abc.abstractmethod
    def device_name(self, device_index): ...

    @abc.abstractmethod
    def device(self, device_index): ...

    @abc.abstractmethod
    def set_device(self, device_index): ...

    @abc.abstractmethod
    def current_device(self): ...

    @abc.abstractmethod
    def current_device_name(self): ...

    @abc.abstractmethod
    def device_count(self): ...

    @abc.abstractmethod
    def synchronize(self, device_index=None): ...

    # RNG
    @abc.abstractmethod
    def random(self): ...

    @abc.abstractmethod
    def set_rng_state(self, new_state, device_index=None): ...

    @abc.abstractmethod
    def get_rng_state(self, device_index=None): ...

    @abc.abstractmethod
    def manual_seed(self, seed): ...

    @abc.abstractmethod
    def manual_seed_all(self, seed): ...

    @abc.abstractmethod
    def initial_seed(self): ...

    @abc.abstractmethod
    def default_generator(self, device_index): ...

    # streams and events
    @property
    @abc.abstractmethod
    def Stream(self): ...

    @abc.abstractmethod
    def stream(self, stream): ...

    @abc.abstractmethod
    def current_stream(self, device_index=None): ...

    @abc.abstractmethod
    def default_stream(self, device_index=None): ...

    @property
    @abc.abstractmethod
    def Event(self): ...

    # memory
    @abc.abstractmethod
    def empty_cache(self): ...

    @abc.abstractmethod
    def memory_allocated(self, device_index=None): ...

    @abc.abstractmethod
    def max_memory_allocated(self, device_index=None): ...

    @abc.abstractmethod
    def reset_max_memory_allocated(self, device_index=None): ...

    @abc.abstractmethod
    def memory_cached(self, device_index=None): ...

    @abc.abstractmethod
    def max_memory_cached(self, device_index=None): ...

    @abc.abstractmethod
    def reset_max_memory_cached(self, device_index=None): ...

    @abc.abstractmethod
    def memory_stats(self, device_index=None): ...

    @abc.abstractmethod
    def reset_peak_memory_stats(self, device_index=None): ...

    @abc.abstractmethod
    def memory_reserved(self, device_index=None): ...

    @abc.abstractmethod
    def max_memory_reserved(self, device_index=None): ...

    @abc.abstractmethod
    def total_memory(self, device_index=None): ...

    @abc.abstractmethod
    def available_memory(self, device_index=None): ...

    # data types
    @abc.abstractmethod
    def is_bf16_supported(self): ...

    @abc.abstractmethod
    def is_fp16_supported(self): ...

    def is_fp64_supported(self):
        return True

    @abc.abstractmethod
    def supported_dtypes(self): ...

    # misc
    @abc.abstractmethod
    def is_available(self): ...

    @abc.abstractmethod
    def range_push(self, msg, domain=None, category=None): ...

    @abc.abstractmethod
    def range_pop(self, domain=None): ...

    @abc.abstractmethod
    def lazy_call(self, callback): ...

    @abc.abstractmethod
    def communication_backend_name(self): ...

    @abc.abstractmethod
    def is_triton_supported(self): ...

    def prefer_triton_grouped_mm(self):
        return False

    # graphs
    def is_current_stream_capturing(self) -> bool:
        return False

    @abc.abstractmethod
    def create_graph(self): ...

    @abc.abstractmethod
    def capture_to_graph(self, graph, pool=None, stream=None): ...

    @abc.abstractmethod
    def replay_graph(self, graph): ...

    # tensor types
    @property
    @abc.abstractmethod
    def BFloat16Tensor(self): ...

    @property
    @abc.abstractmethod
    def ByteTensor(self): ...

    @property
    @abc.abstractmethod
    def DoubleTensor(self): ...

    @property
    @abc.abstractmethod
    def FloatTensor(self): ...

    @property
    @abc.abstractmethod
    def HalfTensor(self): ...

    @property
    @abc.abstractmethod
    def IntTensor(self): ...

    @property
    @abc.abstractmethod
    def LongTensor(self): ...

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

    def _torch_is_pinned(self, tensor) -> bool:
        return tensor.is_pinned()

    def is_pinned(self, tensor) -> bool:
        return self._torch_is_pinned(tensor)

    def unpin_memory(self, tensor):
        return None

    def register_host_memory(self, address, num_bytes) -> bool:
        return False

    def unregister_host_memory(self, address):
        return None

    def pin_memory_alignment(self) -> int:
        return 1

    @abc.abstractmethod
    def on_accelerator(self, tensor): ...

    # op builders, environment, compile
    @abc.abstractmethod
    def op_builder_dir(self): ...

    @abc.abstractmethod
    def create_op_builder(self, class_name): ...

    @abc.abstractmethod
    def get_op_builder(self, class_name): ...

    @abc.abstractmethod
    def build_extension(self): ...

    @abc.abstractmethod
    def export_envs(self): ...

    @abc.abstractmethod
    def visible_devices_envs(self): ...

    @abc.abstractmethod
    def set_visible_devices_envs(self, current_env, local_accelerator_ids): ...

    @abc.abstractmethod
    def get_compile_backend(self): ...

    @abc.abstractmethod
    def set_compile_backend(self, backend): ...


class TorchAccelerator(DeepSpeedAccelerator):
    """What ds_zero's cpu and cuda accelerators answer alike (DeepSpeed repeats it in each of its classes):
    timers and memory back-pressure follow ``is_synchronized_device``, torch's RNG module, the dtypes, ds_zero's op
    builders, the visible-devices variables, and the compile backend."""

    def __init__(self):
        super().__init__()
        self._compile_backend = "inductor"

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

    def supported_dtypes(self) -> list:
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

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
