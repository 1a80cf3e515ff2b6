"""The stack of layers a pipeline stage (or virtual chunk) owns, plus the final norm on the last stage
(``megatron/core/transformer/transformer_block.py``).

Layer ownership follows Megatron's ``get_transformer_layer_offset``: without virtual stages, stage p
owns layers ``[p*L/pp, (p+1)*L/pp)``; with ``vpp`` chunks, chunk v of stage p owns
``v*L/vpp + p*L/(pp*vpp) + [0, L/(pp*vpp))`` so consecutive chunks round-robin over the stages.
Each layer is built from the spec (one ``ModuleSpec`` for every layer, or ``TransformerBlockSubmodules``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.random import checkpoint
from mega_par.transformer.module import MegatronModule
from mega_par.transformer.spec_utils import ModuleSpec, build_module
from mega_par.transformer.torch_norm import WrappedTorchNorm
from mega_par.transformer.utils import replace_prefix_for_sharding, sharded_state_dict_default


def get_num_layers_to_build(config, vp_stage: int | None = None, pp_rank: int | None = None) -> int:
    """Layers per stage (or virtual chunk): the same on every stage here (no uneven first/last stage)."""
    pp = ps.get_pipeline_model_parallel_world_size()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    if config.num_layers % (pp * vpp):
        raise ValueError(f"num_layers ({config.num_layers}) must be divisible by pipeline_model_parallel_size ({pp}) "
                         f"x virtual_pipeline_model_parallel_size ({vpp})")
    return config.num_layers // (pp * vpp)


def get_transformer_layer_offset(config, vp_stage: int | None = None, pp_rank: int | None = None) -> int:
    """The 0-based index of the first layer of ``pp_rank``'s stage (default this rank's), chunk ``vp_stage``."""
    pp_rank = ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    per_chunk = get_num_layers_to_build(config)
    if vpp is None:
        return pp_rank * per_chunk
    vrank = ps.get_virtual_pipeline_model_parallel_rank() if vp_stage is None else vp_stage
    return vrank * (config.num_layers // vpp) + pp_rank * per_chunk


@dataclass
class TransformerBlockSubmodules:
    layer_specs: list = field(default_factory=list)  # one spec per layer of the whole model
    layer_norm: object = None  # the final norm; None: WrappedTorchNorm


def _get_block_submodules(config, spec) -> TransformerBlockSubmodules:
    if isinstance(spec, TransformerBlockSubmodules):
        if len(spec.layer_specs) != config.num_layers:
            raise ValueError(f"TransformerBlockSubmodules has {len(spec.layer_specs)} layer specs, "
                             f"config.num_layers is {config.num_layers}")
        return spec
    if isinstance(spec, ModuleSpec):
        return TransformerBlockSubmodules(layer_specs=[spec] * config.num_layers, layer_norm=WrappedTorchNorm)
    raise TypeError(f"TransformerBlock spec must be a ModuleSpec or TransformerBlockSubmodules, got {spec!r}")


class TransformerBlock(MegatronModule):
    def __init__(self, config, spec, post_layer_norm: bool = True, pre_process: bool = True,
                 post_process: bool = True, pg_collection=None, vp_stage: int | None = None,
                 layer_seed: int | None = None):
        """``layer_seed`` (mega_par's): when given, layer ``L`` is initialised under ``torch.manual_seed(layer_seed
        + L)``, so its weights do not depend on which stage builds it (reproducible across pipeline layouts)."""
        super().__init__(config=config)
        self.pre_process, self.post_process = pre_process, post_process
        self.submodules = _get_block_submodules(config, spec)
        offset = get_transformer_layer_offset(config, vp_stage)
        layers = []
        for i in range(get_num_layers_to_build(config, vp_stage)):
            number = offset + i + 1
            with torch.random.fork_rng(devices=[]):
                if layer_seed is not None:
                    torch.manual_seed(layer_seed + number)
                layers.append(build_module(self.submodules.layer_specs[number - 1], config=config,
                                           layer_number=number))
        self.layers = nn.ModuleList(layers)
        self.final_layernorm = build_module(self.submodules.layer_norm or WrappedTorchNorm, config=config,
                                            hidden_size=config.hidden_size, eps=config.layernorm_epsilon) \
            if post_process and post_layer_norm else None
        self.input_tensor = None

    def _run_layers(self, start: int, end: int, kwargs: dict):
        def run(hidden_states, attention_mask, context, context_mask, rotary_pos_emb):
            for layer in self.layers[start:end]:
                hidden_states, context = layer(hidden_states, attention_mask=attention_mask, context=context,
                                               context_mask=context_mask, rotary_pos_emb=rotary_pos_emb, **kwargs)
            return hidden_states, context
        return run

    def has_final_layernorm_in_this_stage(self) -> bool:
        return self.final_layernorm is not None

    def set_input_tensor(self, input_tensor) -> None:
        """The activation received from the previous pipeline stage replaces the embedding output."""
        self.input_tensor = input_tensor

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Layer ``i`` is saved under ``<prefix>layers.<name>`` at index ``layer_number - 1`` of a prepended
        ``num_layers`` axis, so any pipeline split finds its layers; the final norm as it is."""
        if sharded_offsets:
            raise ValueError(f"TransformerBlock.sharded_state_dict: unexpected sharded_offsets {sharded_offsets}")
        layers_prefix, out = f"{prefix}layers.", {}
        for i, layer in enumerate(self.layers):
            offsets = ((0, layer.layer_number - 1, self.config.num_layers),)
            sub = sharded_state_dict_default(layer, f"{layers_prefix}{i}.", offsets, metadata)
            replace_prefix_for_sharding(sub, f"{layers_prefix}{i}.", layers_prefix)
            out.update(sub)
        for name, module in self.named_children():
            if name != "layers":
                out.update(sharded_state_dict_default(module, f"{prefix}{name}.", (), metadata))
        return out

    def forward(self, hidden_states, attention_mask=None, context=None, context_mask=None, rotary_pos_emb=None,
                **kwargs):
        if not self.pre_process or hidden_states is None:
            hidden_states = self.input_tensor
        recompute = self.config.recompute_granularity == "full" and self.training
        n = self.config.recompute_num_layers or 1
        i = 0
        while i < len(self.layers):
            # "uniform": every run of n layers is one checkpoint; "block": the first n layers, one at a time
            uniform = recompute and self.config.recompute_method == "uniform"
            span = n if uniform else 1
            run = self._run_layers(i, i + span, kwargs)
            if uniform or (recompute and i < n):
                hidden_states, context = checkpoint(run, False, hidden_states, attention_mask, context, context_mask,
                                                    rotary_pos_emb)
            else:
                hidden_states, context = run(hidden_states, attention_mask, context, context_mask, rotary_pos_emb)
            i += span
        if self.final_layernorm is not None:
            hidden_states = self.final_layernorm(hidden_states)
        return hidden_states
