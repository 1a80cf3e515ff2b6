"""The MLP split over TP ranks: column-parallel fc1 -> activation -> row-parallel fc2 (arXiv 1909.08053 §3,
Fig. 3a; ``megatron/core/transformer/mlp.py``).

Splitting fc1 by columns lets the nonlinearity run locally (no sync before GeLU); fc2 by rows leaves
partial sums that one ``g`` all-reduce (or SP reduce-scatter) combines. With a gated linear unit the
fused fc1 weight is ``[gate; up]`` and is sharded with ``stride=2`` so each rank holds ``[gate_r; up_r]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mega_par.transformer.module import MegatronModule
from mega_par.transformer.spec_utils import build_module


@dataclass
class MLPSubmodules:
    linear_fc1: object = None
    linear_fc2: object = None
    activation_func: object = None  # None: config.activation_func (Megatron's TE activation slot)


class MLP(MegatronModule):
    def __init__(self, config, submodules: MLPSubmodules, is_expert: bool = False, input_size: int | None = None,
                 ffn_hidden_size: int | None = None):
        super().__init__(config=config)
        if is_expert:
            raise ValueError("MLP: is_expert=True (mixture of experts) is not supported by mega_par")
        if submodules.activation_func is not None:
            raise ValueError("MLP: an activation_func submodule is not supported; set config.activation_func")
        glu = config.gated_linear_unit
        input_size = input_size or config.hidden_size
        ffn = ffn_hidden_size or config.ffn_hidden_size
        self.linear_fc1 = build_module(submodules.linear_fc1, input_size, ffn * (2 if glu else 1), config=config,
                                       init_method=config.init_method, bias=config.add_bias_linear,
                                       gather_output=False, skip_bias_add=False, stride=2 if glu else 1)
        self.linear_fc2 = build_module(submodules.linear_fc2, ffn, config.hidden_size, config=config,
                                       init_method=config.output_layer_init_method, bias=config.add_bias_linear,
                                       input_is_parallel=True, skip_bias_add=True)

    def forward(self, hidden_states):
        intermediate, _ = self.linear_fc1(hidden_states)
        if self.config.gated_linear_unit:
            gate, up = intermediate.chunk(2, dim=-1)
            intermediate = self.config.activation_func(gate) * up
        else:
            intermediate = self.config.activation_func(intermediate)
        return self.linear_fc2(intermediate)
