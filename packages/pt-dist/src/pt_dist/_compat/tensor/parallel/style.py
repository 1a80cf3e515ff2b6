"""Tensor-parallel styles (torch's ``torch/distributed/tensor/parallel/style.py``; Megatron-LM's column- and
row-parallel layers, arXiv:1909.08053 section 3, and sequence parallelism, arXiv:2205.05198 section 4.2).

Each style is ``distribute_module`` with three functions: how the parameters are laid out (``partition``), what the
module's input must be (``prepare_input``: a plain tensor read as ``input_layouts``, then redistributed to what the
layer needs) and what its output becomes (``prepare_output``). Column-parallel ``y = x A``: ``A`` split by output
features (``Shard(0)`` of ``nn.Linear.weight``), ``x`` replicated, ``y`` sharded on its last dim. Row-parallel:
``A`` split by input features (``Shard(1)``), ``x`` sharded on its last dim, ``y`` a Partial sum, all-reduced (or
reduce-scattered to a sequence shard). An ``nn.Embedding`` is the row/column case of its table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Any

import torch
from torch import nn

from pt_dist._compat.tensor.distribute_module import distribute_module
from pt_dist.device_mesh import DeviceMesh
from pt_dist.tensor._api import DTensor, distribute_tensor
from pt_dist.tensor.placement_types import Placement, Replicate, Shard

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput",
           "PrepareModuleOutput", "RowwiseParallel", "SequenceParallel"]


class ParallelStyle(ABC):
    """How ``parallelize_module`` lays one module out (torch's ``ParallelStyle``); ``src_data_rank`` is the rank
    whose values ``distribute_tensor`` scatters (None: every rank keeps its own)."""

    src_data_rank: int | None = 0

    @abstractmethod
    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module: ...


def _as_dtensor(x, mesh: DeviceMesh, layout: tuple, desired: tuple) -> DTensor:
    """A plain tensor read as ``layout`` (no communication), then redistributed to ``desired``."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, layout, run_check=False)
    if layout != desired:
        x = x.redistribute(placements=desired, async_op=True)
    return x


def _shard_params(module: nn.Module, mesh: DeviceMesh, placements: dict[str, Placement], src_data_rank) -> None:
    """Each named parameter of ``module`` (``Replicate`` if not named) distributed from ``src_data_rank``."""
    for name, param in list(module.named_parameters(recurse=False)):
        dparam = distribute_tensor(param, mesh, [placements.get(name, Replicate())], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dparam, requires_grad=param.requires_grad))


class _LinearStyle(ParallelStyle):
    """What column- and row-parallel share: the layouts, the hooks, ``repr``."""

    _kind = ""

    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = True) -> None:
        super().__init__()
        default_in, default_out = (Replicate(), Shard(-1)) if self._kind == "col" else (Shard(-1), Replicate())
        self.input_layouts = (input_layouts or default_in,)
        self.output_layouts = (output_layouts or default_out,)
        self.use_local_output = use_local_output

    @staticmethod
    def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        return _as_dtensor(inputs[0], device_mesh, input_layouts, desired_input_layouts)

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        if outputs.placements != output_layouts:
            outputs = outputs.redistribute(placements=output_layouts, async_op=True)
        return outputs.to_local() if use_local_output else outputs

    def _weight_layouts(self, module: nn.Module) -> tuple[dict, tuple]:
        """(the parameters' placements, the input the layer needs) for ``module``."""
        raise NotImplementedError

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise NotImplementedError(f"{type(self).__name__} currently only support nn.Linear and nn.Embedding! "
                                      f"(got {type(module).__name__})")
        params, self.desired_input_layouts = self._weight_layouts(module)
        return distribute_module(
            module, device_mesh, lambda name, mod, mesh: _shard_params(mod, mesh, params, self.src_data_rank)
            if mod is module else None,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")


class ColwiseParallel(_LinearStyle):
    """``nn.Linear`` split by output features (weight and bias ``Shard(0)``), ``nn.Embedding`` by embedding dim
    (``Shard(1)``); input replicated, output ``Shard(-1)`` (torch's ``ColwiseParallel``)."""

    _kind = "col"

    def _weight_layouts(self, module):
        dim = 0 if isinstance(module, nn.Linear) else 1
        return {name: Shard(dim) for name, _ in module.named_parameters(recurse=False)}, (Replicate(),)


class RowwiseParallel(_LinearStyle):
    """``nn.Linear`` split by input features (weight ``Shard(1)``, bias replicated; input ``Shard(-1)``),
    ``nn.Embedding`` by rows (``Shard(0)``; input replicated); the output a Partial sum, by default all-reduced to
    ``Replicate`` (torch's ``RowwiseParallel``)."""

    _kind = "row"

    def _weight_layouts(self, module):
        if isinstance(module, nn.Linear):
            return {"weight": Shard(1), "bias": Replicate()}, (Shard(-1),)
        return {name: Shard(0) for name, _ in module.named_parameters(recurse=False)}, (Replicate(),)


class SequenceParallel(ParallelStyle):
    """A module that works row by row (a norm, dropout) run on a sequence shard: its parameters replicated (from
    each rank's own values, as torch's), its input ``Shard(sequence_dim)`` (torch's ``SequenceParallel``)."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        super().__init__()
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def _replicate_module_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        for p_name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(p_name, nn.Parameter(
                DTensor.from_local(param, device_mesh, [Replicate()], run_check=False)))

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
        x = inputs[0]
        if isinstance(x, DTensor):
            return x if x.placements == sequence_sharding else x.redistribute(placements=sequence_sharding,
                                                                              async_op=True)
        if isinstance(x, torch.Tensor):
            return DTensor.from_local(x, device_mesh, sequence_sharding, run_check=False)
        raise ValueError(f"expecting input of {mod} to be a torch.Tensor or DTensor, but got {x}")

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):
        return outputs.to_local() if use_local_output else outputs

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._replicate_module_fn,
                                 partial(self._prepare_input_fn, self.sequence_sharding),
                                 partial(self._prepare_output_fn, self.use_local_output))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(sequence_dim={self.sequence_sharding[0].dim}, "
                f"use_local_output={self.use_local_output})")


def _as_tuple(layouts):
    return (layouts,) if isinstance(layouts, Placement) else layouts


class PrepareModuleInput(ParallelStyle):
    """Lay a module's positional (``input_layouts`` -> ``desired_input_layouts``) and keyword
    (``input_kwarg_layouts`` -> ``desired_input_kwarg_layouts``) inputs out before its forward; a None layout
    leaves that input as it is (torch's ``PrepareModuleInput``)."""

    def __init__(self, *, input_layouts: Placement | tuple[Placement | None, ...] | None = None,
                 desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
                 input_kwarg_layouts: dict[str, Placement] | None = None,
                 desired_input_kwarg_layouts: dict[str, Placement] | None = None,
                 use_local_output: bool = False) -> None:
        self.input_layouts = _as_tuple(input_layouts)
        self.desired_input_layouts = _as_tuple(desired_input_layouts)
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise AssertionError("desired module inputs should not be None!")
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise AssertionError(f"input_layouts and desired_input_layouts should have same length! "
                                     f"({self.input_layouts} vs {self.desired_input_layouts})")
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = input_kwarg_layouts or {}
        self.desired_input_kwarg_layouts = desired_input_kwarg_layouts or {}
        if self.with_kwargs and len(self.input_kwarg_layouts) != len(self.desired_input_kwarg_layouts):
            raise AssertionError("input_kwarg_layouts and desired_input_kwarg_layouts should have same length!")

    def _prepare_input_arg(self, value: Any, mesh: DeviceMesh, layout, desired):
        if layout is None:
            return value
        if not isinstance(value, torch.Tensor):
            raise AssertionError(f"expecting input to be a torch.Tensor! (got {type(value).__name__})")
        x = _as_dtensor(value, mesh, (layout,), (desired,) if desired is not None else (layout,))
        return x.to_local() if self.use_local_output else x

    def _prepare_input_fn(self, inputs, device_mesh):
        if self.input_layouts is None:
            return inputs
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        if len(inputs) != len(self.input_layouts):
            raise ValueError(f"module inputs and input_layouts should have same length! ({len(inputs)} inputs, "
                             f"{len(self.input_layouts)} layouts)")
        return tuple(self._prepare_input_arg(x, device_mesh, lay, want)
                     for x, lay, want in zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _prepare_input_kwarg_fn(self, inputs, kwarg_inputs, device_mesh):
        args = self._prepare_input_fn(inputs, device_mesh)
        kwargs = {key: self._prepare_input_arg(value, device_mesh, self.input_kwarg_layouts.get(key),
                                               self.desired_input_kwarg_layouts.get(key))
                  for key, value in kwarg_inputs.items()}
        return args, kwargs

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if self.with_kwargs:
            module.register_forward_pre_hook(
                lambda _, inputs, kwargs: self._prepare_input_kwarg_fn(inputs, kwargs, device_mesh),
                with_kwargs=True)
        else:
            module.register_forward_pre_hook(lambda _, inputs: self._prepare_input_fn(inputs, device_mesh))
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, desired_input_layouts="
                f"{self.desired_input_layouts}, input_kwarg_layouts={self.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
                f"use_local_output={self.use_local_output})")


class PrepareModuleOutput(ParallelStyle):
    """Lay a module's output(s) out after its forward: ``output_layouts`` -> ``desired_output_layouts`` (torch's
    ``PrepareModuleOutput``)."""

    def __init__(self, *, output_layouts: Placement | tuple[Placement | None, ...],
                 desired_output_layouts: Placement | tuple[Placement, ...], use_local_output: bool = True) -> None:
        self.output_layouts = _as_tuple(output_layouts)
        self.desired_output_layouts = _as_tuple(desired_output_layouts)
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise AssertionError(f"output_layouts and desired_output_layouts should have same length! "
                                 f"({self.output_layouts} vs {self.desired_output_layouts})")

    def _prepare_out_fn(self, outputs, device_mesh):
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if len(outputs) != len(self.output_layouts):
            raise ValueError(f"module outputs and output_layouts should have same length! ({len(outputs)} "
                             f"outputs, {len(self.output_layouts)} layouts)")
        prepared = []
        for out, layout, desired in zip(outputs, self.output_layouts, self.desired_output_layouts):
            if layout is not None:
                out = _as_dtensor(out, device_mesh, (layout,), (desired,))
                out = out.to_local() if self.use_local_output else out
            prepared.append(out)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_hook(lambda _, inputs, outputs: self._prepare_out_fn(outputs, device_mesh))
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_layouts={self.output_layouts}, desired_output_layouts="
                f"{self.desired_output_layouts}, use_local_output={self.use_local_output})")


class PrepareModuleInputOutput(ParallelStyle):
    """``PrepareModuleInput`` and ``PrepareModuleOutput`` on one module (torch's ``PrepareModuleInputOutput``)."""

    def __init__(self, *, input_layouts: Placement | tuple[Placement | None, ...] | None = None,
                 desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
                 input_kwarg_layouts: dict[str, Placement] | None = None,
                 desired_input_kwarg_layouts: dict[str, Placement] | None = None, use_local_input: bool = False,
                 output_layouts: Placement | tuple[Placement | None, ...],
                 desired_output_layouts: Placement | tuple[Placement, ...], use_local_output: bool = True) -> None:
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module

    def __repr__(self) -> str:
        inp, out = self.prepare_module_input, self.prepare_module_output
        return (f"{type(self).__name__}(input_layouts={inp.input_layouts}, desired_input_layouts="
                f"{inp.desired_input_layouts}, input_kwarg_layouts={inp.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={inp.desired_input_kwarg_layouts}, "
                f"use_local_input={inp.use_local_output}, output_layouts={out.output_layouts}, "
                f"desired_output_layouts={out.desired_output_layouts}, use_local_output={out.use_local_output})")
