"""The MLP split over TP ranks: column-parallel fc1 -> activation -> row-parallel fc2 (arXiv 1909.08053 §3, Fig. 3a).

Splitting fc1 by columns lets the nonlinearity run locally (no sync before GeLU); fc2 by rows leaves
partial sums that one ``g`` all-reduce (or SP reduce-scatter) combines. With a gated linear unit the
fused fc1 weight is ``[gate; up]`` and is sharded with ``stride=2`` so each rank holds ``[gate_r; up_r]``.
"""

from __future__ import annotations

from torch import nn

from mega_par.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        glu = config.gated_linear_unit
        self.linear_fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_hidden_size * (2 if glu else 1),
                                               config=config, init_method=config.init_method,
                                               bias=config.add_bias_linear, gather_output=False,
                                               skip_bias_add=False, stride=2 if glu else 1)
        self.linear_fc2 = RowParallelLinear(config.ffn_hidden_size, config.hidden_size, config=config,
                                            init_method=config.output_layer_init_method,
                                            bias=config.add_bias_linear, input_is_parallel=True, skip_bias_add=True)

    def forward(self, hidden_states):
        intermediate, _ = self.linear_fc1(hidden_states)
        if self.config.gated_linear_unit:
            gate, up = intermediate.chunk(2, dim=-1)
            intermediate = self.config.activation_func(gate) * up
        else:
            intermediate = self.config.activation_func(intermediate)
        return self.linear_fc2(intermediate)
