"""``PipelineModule``: a model given as a list of layers, cut into contiguous stages (DeepSpeed's
``deepspeed/runtime/pipe/module.py``).

Each rank builds only its stage's layers (``LayerSpec`` defers construction, so the whole model never exists
on one rank). ``partition_method`` balances stages by parameter count (``"parameters"``), by layer count
(``"uniform"``) or by the number of layers whose class name matches a regex (``"type:REGEX"``).
``TiedLayerSpec`` layers with the same key share one module per stage and one weight across stages: the
copies start equal (broadcast from the first stage holding the key) and their gradients are summed between
those stages before the optimizer step. ``seed_layers`` seeds layer i's construction with ``base_seed + i``,
so the pipelined model is the one a single process would build with the same seeds.
"""

from __future__ import annotations

import logging
import re

import torch
import torch.distributed as dist

from ds_zero.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid
from ds_zero.runtime.activation_checkpointing import checkpointing

logger = logging.getLogger(__name__)


class PipelineError(Exception):
    """A pipeline that cannot be built as asked."""


class LayerSpec:
    """``LayerSpec(torch.nn.Linear, 8, 8)``: a layer to build later, on the stage that owns it."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not issubclass(typename, torch.nn.Module):
            raise PipelineError(f"LayerSpec needs a torch.nn.Module subclass, got {typename!r}")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def __repr__(self):
        return f"LayerSpec({self.typename.__name__})"

    def build(self, log: bool = False) -> torch.nn.Module:
        if log:
            logger.info("building %r", self)
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """Layers sharing ``key`` share their module (and its ``tied_weight_attr`` weights) across the pipeline."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Boundaries of ``num_parts`` contiguous parts differing by at most one item (the first ones get more)."""
    parts = [0] * (num_parts + 1)
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    for p in range(num_parts):
        parts[p + 1] = parts[p] + chunk + (1 if p < residual else 0)
    return parts


def partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """Contiguous non-empty parts minimising the heaviest one: binary search on that bound, each candidate
    checked by filling parts greedily (as much as fits, leaving one item for every part still to come)."""
    n = len(weights)
    if n < num_parts:
        raise PipelineError(f"cannot cut {n} layers into {num_parts} non-empty stages")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def fill(limit: float) -> list[int]:
        bounds = [0]
        for p in range(num_parts - 1):
            start, end = bounds[-1], bounds[-1] + 1
            last_end = n - (num_parts - 1 - p)
            while end < last_end and prefix[end + 1] - prefix[start] <= limit:
                end += 1
            bounds.append(end)
        return bounds + [n]

    def heaviest(bounds: list[int]) -> float:
        return max(prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:]))

    lo, hi = max(weights, default=0.0), prefix[-1]
    for _ in range(60):
        mid = (lo + hi) / 2
        if heaviest(fill(mid)) <= mid:
            hi = mid
        else:
            lo = mid
    return fill(hi)


class PipelineModule(torch.nn.Module):
    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers: bool = False,
                 seed_fn=None, base_seed: int = 1234, partition_method: str = "parameters",
                 activation_checkpoint_interval: int = 0, activation_checkpoint_func=checkpointing.checkpoint,
                 checkpointable_layers=None):
        super().__init__()
        layers = list(layers)
        if num_stages is None and topology is None:
            raise PipelineError("PipelineModule needs num_stages or topology")
        if not dist.is_initialized():
            raise PipelineError("PipelineModule needs torch.distributed initialised (it builds the process grid)")
        # Everything checkable is checked before the grid's process groups are created (that is communication).
        world = dist.get_world_size()
        if topology is None:
            if num_stages < 1 or world % num_stages:
                raise PipelineError(f"num_stages={num_stages} must divide the world size {world}")
            topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=world // num_stages)
        num_stages = topology.get_dim("pipe")
        if num_stages > len(layers):
            raise PipelineError(f"{num_stages} pipeline stages but only {len(layers)} layers: each stage needs one")
        if activation_checkpoint_interval < 0:
            raise PipelineError(f"activation_checkpoint_interval must be >= 0, got {activation_checkpoint_interval}")
        self._layer_specs = layers
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func
        self.checkpointable_layers = checkpointable_layers
        self.num_stages = num_stages
        self._topo = topology
        self.parts = self._partition_layers(partition_method)
        self._grid = PipelineParallelGrid(topology=topology)
        self.global_rank = dist.get_rank()
        self.stage_id = self._grid.get_stage_id()
        self._local_start, self._local_stop = self.parts[self.stage_id], self.parts[self.stage_id + 1]
        self.forward_funcs = []
        self.tied_modules = torch.nn.ModuleDict()
        self.tied_weight_attrs = {}
        self._build()
        self.tied_comms = self._index_tied_modules()
        self._synchronize_tied_weights()

    # --- construction ---------------------------------------------------------------------------------------
    def _partition_layers(self, method: str) -> list[int]:
        method = method.lower()
        n = len(self._layer_specs)
        if method == "uniform":
            return partition_uniform(n, self.num_stages)
        if method == "parameters":
            return partition_balanced(self._count_layer_params(), self.num_stages)
        if method.startswith("type:"):
            pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
            weights = [1.0 if pattern.search(self._layer_name(spec)) else 0.0 for spec in self._layer_specs]
            if not any(weights):
                raise PipelineError(f"partition_method {method!r}: no layer's class name matches")
            return partition_balanced(weights, self.num_stages)
        raise PipelineError(f"partition_method {method!r} is not one of 'parameters', 'uniform', 'type:REGEX'")

    @staticmethod
    def _layer_name(spec) -> str:
        if isinstance(spec, LayerSpec):
            return spec.typename.__name__
        if isinstance(spec, torch.nn.Module):
            return type(spec).__name__
        return getattr(spec, "__name__", type(spec).__name__)

    def _count_layer_params(self) -> list[float]:
        """DeepSpeed counts by building each spec once on every rank (on the meta device here: no memory)."""
        counts = []
        for spec in self._layer_specs:
            if isinstance(spec, LayerSpec):
                with torch.device("meta"):
                    layer = spec.build()
                counts.append(float(sum(p.numel() for p in layer.parameters() if p.requires_grad)))
            elif isinstance(spec, torch.nn.Module):
                counts.append(float(sum(p.numel() for p in spec.parameters() if p.requires_grad)))
            else:
                counts.append(0.0)
        return counts

    def _build(self) -> None:
        for idx in range(self._local_start, self._local_stop):
            spec = self._layer_specs[idx]
            if self.seed_layers:
                (self.seed_fn or torch.manual_seed)(self.base_seed + idx)
            if isinstance(spec, TiedLayerSpec):
                if spec.key not in self.tied_modules:
                    self.tied_modules[spec.key] = spec.build()
                    self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
                module = self.tied_modules[spec.key]
                fn = spec.forward_fn
                self.forward_funcs.append(module if fn is None else (lambda x, m=module, fn=fn: fn(m, x)))
            elif isinstance(spec, LayerSpec):
                module = spec.build()
                self.add_module(str(idx), module)
                self.forward_funcs.append(module)
            elif isinstance(spec, torch.nn.Module):
                self.add_module(str(idx), spec)
                self.forward_funcs.append(spec)
            elif callable(spec):
                self.forward_funcs.append(spec)
            else:
                raise PipelineError(f"layer {idx} is {spec!r}: expected a LayerSpec, a module or a callable")

    def _stages_holding(self, key) -> list[int]:
        return sorted({s for s in range(self.num_stages) for spec in self._layer_specs[self.parts[s]:self.parts[s + 1]]
                       if isinstance(spec, TiedLayerSpec) and spec.key == key})

    def _index_tied_modules(self) -> dict:
        """For each key held on several stages: the process group of those stages (one per data/model coord)."""
        keys = sorted({spec.key for spec in self._layer_specs if isinstance(spec, TiedLayerSpec)})
        comms = {}
        axes = [a for a in self._topo.get_axis_names() if a != "pipe"]
        for key in keys:
            stages = self._stages_holding(key)
            if len(stages) < 2:
                continue
            for other in self._topo.get_axis_comm_lists("pipe") or [list(range(self._topo.world_size()))]:
                coord = self._topo.get_coord(other[0])._asdict()
                ranks = [self._topo.get_rank(**{a: coord[a] for a in axes}, pipe=s) for s in stages]
                group = dist.new_group(ranks)  # every rank creates every group, in the same order
                if self.global_rank in ranks:
                    comms[key] = {"ranks": ranks, "group": group, "weight_attr": self.tied_weight_attrs[key],
                                  "module": self.tied_modules[key]}
            if key in comms and self.stage_id != stages[0]:
                for attr in comms[key]["weight_attr"]:
                    # counted once in the global norm: on the first stage holding it
                    self._recursive_getattr(comms[key]["module"], attr).ds_pipe_replicated = True
        return comms

    def _synchronize_tied_weights(self) -> None:
        for comm in self.tied_comms.values():
            for attr in comm["weight_attr"]:
                dist.broadcast(self._recursive_getattr(comm["module"], attr).data, src=comm["ranks"][0],
                               group=comm["group"])

    @staticmethod
    def _recursive_getattr(module: torch.nn.Module, attr_name: str) -> torch.Tensor:
        for item in attr_name.split("."):
            module = getattr(module, item)
        return module

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum the tied copies' gradients between the stages holding them (ReduceTiedGrads)."""
        for comm in self.tied_comms.values():
            for attr in comm["weight_attr"]:
                weight = self._recursive_getattr(comm["module"], attr)
                if weight.grad is not None:
                    dist.all_reduce(weight.grad, group=comm["group"])

    def get_tied_weights_and_groups(self) -> list:
        return [(self._recursive_getattr(c["module"], a), c["group"]) for c in self.tied_comms.values()
                for a in c["weight_attr"]]

    # --- forward ---------------------------------------------------------------------------------------------
    def _is_checkpointable(self, funcs) -> bool:
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in funcs)
        return any(isinstance(f, torch.nn.Module) and any(True for _ in f.parameters()) for f in funcs)

    def forward(self, forward_input):
        def exec_range(start, end):
            def run(*inputs):
                x = inputs[0] if len(inputs) == 1 else inputs
                for fn in self.forward_funcs[start:end]:
                    x = fn(x)
                return x

            return run

        n = len(self.forward_funcs)
        interval = self.activation_checkpoint_interval
        if interval == 0 or not torch.is_grad_enabled():
            return exec_range(0, n)(forward_input)
        x = forward_input
        for start in range(0, n, interval):
            end = min(start + interval, n)
            funcs = self.forward_funcs[start:end]
            args = x if isinstance(x, tuple) else (x,)
            x = self.activation_checkpoint_func(exec_range(start, end), *args) if self._is_checkpointable(funcs) \
                else exec_range(start, end)(*args)
        return x

    # --- the grid --------------------------------------------------------------------------------------------
    def partitions(self) -> list[int]:
        return self.parts

    def stage_owner(self, layer_idx: int) -> int:
        for stage in range(self.num_stages):
            if self.parts[stage] <= layer_idx < self.parts[stage + 1]:
                return stage
        raise PipelineError(f"layer {layer_idx} is not in any stage")

    def topology(self):
        return self._topo

    def mpu(self) -> PipelineParallelGrid:
        return self._grid

    def num_pipeline_stages(self) -> int:
        return self.num_stages
