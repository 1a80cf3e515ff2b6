"""``MegatronModule`` (``megatron/core/transformer/module.py``): the base of Megatron's modules, an ``nn.Module``
that carries its ``TransformerConfig`` and builds its distributed-checkpoint state (``sharded_state_dict``); and
``Float16Module``, which runs a model in fp16/bf16 and hands the last stage's outputs back in fp32."""

from __future__ import annotations

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.transformer.utils import make_sharded_tensors_for_checkpoint, sharded_state_dict_default


def param_is_not_shared(param) -> bool:
    return not getattr(param, "shared", False)


class MegatronModule(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def refresh_cache(self) -> None:
        """Called after an in-place weight refit; modules caching values derived from weights override it."""

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False) -> dict:
        return self.state_dict(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Megatron's default: this module's own tensors (TP-split ones chunked along their ``partition_dim``),
        then each child's ``sharded_state_dict`` (a child without one: its state dict, by the same rule)."""
        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)
        axes = {n: p.partition_dim for n, p in self.named_parameters(recurse=False)
                if getattr(p, "tensor_model_parallel", False)}
        out = make_sharded_tensors_for_checkpoint(own, prefix, axes, sharded_offsets)
        for name, module in self.named_children():
            out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata))
        return out

    def set_is_first_microbatch(self) -> None:
        """Under a quantized recipe (fp8, fp4, kitchen, ``quant_recipe``) tell every module with an
        ``is_first_microbatch`` flag to refresh its weight cache; otherwise nothing to refresh."""
        quantized = ("fp8", "fp4", "use_kitchen", "quant_recipe")
        if all(getattr(self.config, k, None) in (None, False) for k in quantized):
            return
        if not hasattr(self, "modules_with_is_first_microbatch"):
            self.modules_with_is_first_microbatch = [m for m in self.modules() if hasattr(m, "is_first_microbatch")]
        for m in self.modules_with_is_first_microbatch:
            m.is_first_microbatch = True

    def set_symmetric_ar(self, set_to: str | None = None) -> None:
        """Megatron switches its layers' all-reduces to symmetric-memory kernels; mega_par has none (None: off)."""
        choices = ("two_shot", "one_shot", "multimem_all_reduce", None)
        if set_to not in choices:
            raise ValueError(f"set_symmetric_ar: set_to must be one of {choices}, got {set_to!r}")
        if set_to is not None:
            raise NotImplementedError(f"set_symmetric_ar({set_to!r}): symmetric-memory all-reduce (NVLS / torch "
                                      "symmetric memory kernels) is not implemented in mega_par")


class GraphableMegatronModule(MegatronModule):
    """Megatron's base for layers it can capture as CUDA graphs; mega_par captures none, so a config asking for
    CUDA graphs is refused by name."""

    def __init__(self, config, vp_stage: int | None = None) -> None:
        super().__init__(config)
        impl = getattr(config, "cuda_graph_impl", "none")
        if impl not in (None, "none"):
            raise NotImplementedError(f"cuda_graph_impl={impl!r}: CUDA graph capture is not implemented in mega_par")


def conversion_helper(val, conversion):
    """Apply ``conversion`` to a value or, recursively, to each item of a tuple/list (keeping its type)."""
    if not isinstance(val, (tuple, list)):
        return conversion(val)
    out = [conversion_helper(v, conversion) for v in val]
    return tuple(out) if isinstance(val, tuple) else out


def fp32_to_float16(val, float16_convertor):
    return conversion_helper(val, lambda v: float16_convertor(v) if torch.is_tensor(v) and v.dtype == torch.float32
                             else v)


def float16_to_fp32(val):
    return conversion_helper(val, lambda v: v.float() if torch.is_tensor(v) and v.dtype in (torch.half, torch.bfloat16)
                             else v)


def mark_keep_in_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a parameter or buffer that ``Float16Module`` must leave in fp32."""
    tensor.keep_in_fp32 = True
    return tensor


def convert_module_to_dtype_except_fp32_marked(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    return module._apply(lambda t: t.to(dtype) if t.is_floating_point() and not getattr(t, "keep_in_fp32", False)
                         else t)


class Float16Module(MegatronModule):
    """The model cast to ``config.fp16`` / ``config.bf16`` (fp32-marked tensors kept); the first stage's fp32
    inputs are cast down, the last stage's outputs back to fp32 (``fp32_output``)."""

    def __init__(self, config, module: nn.Module) -> None:
        super().__init__(config)
        self.fp16, self.bf16 = config.fp16, config.bf16
        if not (self.fp16 or self.bf16):
            raise ValueError("Float16Module: either config.fp16 or config.bf16 should be True")
        self.vp_size = getattr(config, "virtual_pipeline_model_parallel_size", None)
        self.vp_stage = getattr(module, "vp_stage", None)
        self.pg_collection = getattr(module, "pg_collection", None)
        dtype = torch.half if self.fp16 else torch.bfloat16
        self.add_module("module", convert_module_to_dtype_except_fp32_marked(module, dtype))
        self.float16_convertor = lambda t: t.to(dtype)

    def set_input_tensor(self, input_tensor):
        return self.module.set_input_tensor(input_tensor)

    def _is_stage(self, first: bool) -> bool:
        if not ps.model_parallel_is_initialized():
            return True
        if self.vp_stage is not None and self.vp_size is not None:
            if self.vp_stage != (0 if first else self.vp_size - 1):
                return False
        return ps.is_pipeline_first_stage(True) if first else ps.is_pipeline_last_stage(True)

    def forward(self, *inputs, fp32_output: bool = True, **kwargs):
        if self._is_stage(first=True):
            inputs = fp32_to_float16(inputs, self.float16_convertor)
        outputs = self.module(*inputs, **kwargs)
        if fp32_output and self._is_stage(first=False):
            outputs = float16_to_fp32(outputs)
        return outputs

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False) -> dict:
        return self.module.state_dict_for_save_checkpoint(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(self, prefix: str = "", *args, **kwargs) -> dict:
        return self.module.sharded_state_dict(prefix, *args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)
