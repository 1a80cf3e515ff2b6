"""The stack of layers a pipeline stage (or virtual chunk) owns, plus the final norm on the last stage.

Layer ownership follows Megatron's ``get_transformer_layer_offset``: without virtual stages, stage p
owns layers ``[p*L/pp, (p+1)*L/pp)``; with ``vpp`` chunks, chunk v of stage p owns
``v*L/vpp + p*L/(pp*vpp) + [0, L/(pp*vpp))`` so consecutive chunks round-robin over the stages.
"""

from __future__ import annotations

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.random import checkpoint
from mega_par.transformer.transformer_layer import TransformerLayer, build_norm


def get_num_layers_to_build(config) -> int:
    pp = ps.get_pipeline_model_parallel_world_size()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    if config.num_layers % (pp * vpp):
        raise ValueError(f"num_layers ({config.num_layers}) must be divisible by pipeline_model_parallel_size ({pp}) "
                         f"x virtual_pipeline_model_parallel_size ({vpp})")
    return config.num_layers // (pp * vpp)


def get_transformer_layer_offset(config) -> int:
    pp_rank = ps.get_pipeline_model_parallel_rank()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    per_chunk = get_num_layers_to_build(config)
    if vpp is None:
        return pp_rank * per_chunk
    vrank = ps.get_virtual_pipeline_model_parallel_rank()
    return vrank * (config.num_layers // vpp) + pp_rank * per_chunk


class TransformerBlock(nn.Module):
    def __init__(self, config, post_process: bool = True, layer_seed: int | None = None):
        """``layer_seed``: when given, layer ``L`` is initialised under ``torch.manual_seed(layer_seed + L)``,
        so its weights do not depend on which stage builds it (reproducible across pipeline layouts)."""
        super().__init__()
        self.config, self.post_process = config, post_process
        offset = get_transformer_layer_offset(config)
        layers = []
        for i in range(get_num_layers_to_build(config)):
            number = offset + i + 1
            with torch.random.fork_rng(devices=[]):
                if layer_seed is not None:
                    torch.manual_seed(layer_seed + number)
                layers.append(TransformerLayer(config, number))
        self.layers = nn.ModuleList(layers)
        self.final_layernorm = build_norm(config) if post_process else None
        self.input_tensor = None

    def set_input_tensor(self, input_tensor) -> None:
        """The activation received from the previous pipeline stage replaces the embedding output."""
        self.input_tensor = input_tensor

    def forward(self, hidden_states, rotary_pos_emb=None):
        if hidden_states is None:
            hidden_states = self.input_tensor
        for layer in self.layers:
            if self.config.recompute_granularity == "full" and self.training:
                hidden_states = checkpoint(layer, False, hidden_states, rotary_pos_emb)
            else:
                hidden_states = layer(hidden_states, rotary_pos_emb)
        if self.final_layernorm is not None:
            hidden_states = self.final_layernorm(hidden_states)
        return hidden_states
