"""``deepspeed.zero.Init`` with DeepSpeed's signature, and what upstream model code expects of it, over the core's
:class:`ds_zero.runtime.zero.partition_parameters.Init`:

* the dtype from ``config_dict_or_path`` (or ``config``) when ``dtype`` is not set, else DeepSpeed's default half
  precision (:func:`default_half_dtype`); the data-parallel group from ``mpu``;
* ``module.apply(fn)`` (Hugging Face's ``post_init``) gathers each child's parameters, runs ``fn`` on the full
  tensors, broadcasts the group's rank 0 result and re-partitions (DeepSpeed's ``override_module_apply``);
* a module built on the meta device (``torch.nn.utils.skip_init``) is partitioned after ``to_empty`` gives it
  storage.
"""

from __future__ import annotations

import functools
import logging

import torch

from ds_zero._compat.config import DeepSpeedConfig
from ds_zero.runtime import config as core_config
from ds_zero.runtime.zero import partition_parameters
from ds_zero.runtime.zero.partition_parameters import GatheredParameters, default_half_dtype, is_zero_param

logger = logging.getLogger(__name__)


class Init(partition_parameters.Init):
    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear: bool = True, remote_device=None,
                 pin_memory: bool = False, config_dict_or_path=None, config=None, enabled: bool = True, dtype=None,
                 mpu=None, zero_param_parallel_group=None, zero_quantized_weights: bool = False,
                 zero_quantized_nontrainable_weights: bool = False, sequence_data_parallel_group=None,
                 param_swapper=None):
        """DeepSpeed's signature and order. ``remote_device`` is where the partitions live: None, "none" or "cpu"
        for parameters built on the CPU (CPU offload of CUDA partitions is the engine config's ``offload_param``).
        ``mem_efficient_linear`` changes nothing here: autograd keeps the parameter, whose data is gathered again
        for backward, never a gathered copy. ``pin_memory`` pins CPU partitions in DeepSpeed for copies to a GPU;
        the partitions kept here are on the parameters' own device, so it is logged and has no effect."""
        unsupported = {"zero_param_parallel_group": zero_param_parallel_group, "param_swapper": param_swapper,
                       "sequence_data_parallel_group": sequence_data_parallel_group,
                       "zero_quantized_weights": zero_quantized_weights or None,
                       "zero_quantized_nontrainable_weights": zero_quantized_nontrainable_weights or None}
        for name, value in unsupported.items():
            if value is not None:
                raise ValueError(f"ds_zero.zero.Init({name}={value!r}) is not supported by ds_zero")
        if pin_memory:
            logger.warning("ds_zero.zero.Init(pin_memory=True): partitions stay on the parameters' device; no effect")
        if remote_device not in (None, "none", "cpu"):
            raise ValueError(f"ds_zero.zero.Init(remote_device={remote_device!r}): allowed None, 'none', 'cpu' (NVMe "
                             "partitions come from the engine config's zero_optimization.offload_param)")
        if config_dict_or_path is not None and config is not None:
            raise ValueError("pass the config as config_dict_or_path= or config=, not both")
        cfg = config_dict_or_path if config_dict_or_path is not None else config
        if dtype is None and cfg is not None:
            if not isinstance(cfg, core_config.DeepSpeedConfig):
                cfg = DeepSpeedConfig.load(cfg, torch.distributed.get_world_size())
            dtype = torch.float16 if cfg.fp16.enabled else torch.bfloat16 if cfg.bf16_enabled else None
        elif dtype is None and enabled:
            dtype = default_half_dtype()
        if data_parallel_group is None and mpu is not None:
            data_parallel_group = mpu.get_data_parallel_group()
        self.remote_device = remote_device
        super().__init__(module, data_parallel_group, enabled, dtype)

    def _partition_module(self, module: torch.nn.Module) -> None:
        for p in module.parameters(recurse=False):
            if self.remote_device == "cpu" and p.device.type != "cpu" and not is_zero_param(p):
                raise ValueError(f"ds_zero.zero.Init(remote_device='cpu') got a parameter on {p.device}: use the "
                                 "engine config's zero_optimization.offload_param for CPU partitions of it")
        super()._partition_module(module)

    def _post_init(self, module: torch.nn.Module) -> None:
        if any(p.is_meta for p in module.parameters()):  # skip_init's device="meta" reaches the children too
            self._partition_after_to_empty(module)
        else:
            super()._post_init(module)

    def _partition_after_to_empty(self, module: torch.nn.Module) -> None:
        """skip_init builds on meta then calls ``to_empty``; partition once storage exists."""
        ctx, orig = self, module.to_empty

        def to_empty(*args, **kwargs):
            out = orig(*args, **kwargs)
            del module.to_empty
            for m in out.modules():
                ctx._partition_module(m)
            return out

        module.to_empty = to_empty

    def __enter__(self):
        super().__enter__()
        if self.enabled:
            orig_apply = torch.nn.Module.apply
            torch.nn.Module.apply = _apply_with_gather(orig_apply)
            self._patched.append((torch.nn.Module, "apply", orig_apply))
        return self


def _apply_with_gather(orig_apply):
    def wrap_fn(fn):
        if getattr(fn, "_ds_gathered", False):
            return fn

        @functools.wraps(fn)
        def gathered(module):
            params = [p for p in module.parameters(recurse=False) if is_zero_param(p)]
            if not params:
                return fn(module)
            with GatheredParameters(params, modifier_rank=0):
                fn(module)

        gathered._ds_gathered = True
        return gathered

    @functools.wraps(orig_apply)
    def apply(module, fn):
        return orig_apply(module, wrap_fn(fn))

    return apply
