"""Tensor-parallel layers (Megatron-LM arXiv 1909.08053 §3; ``megatron/core/tensor_parallel/layers.py``).

``ColumnParallelLinear`` splits ``A`` of ``Y = XA`` by columns (output features), ``RowParallelLinear``
by rows (input features); an MLP is column -> GeLU -> row with one all-reduce forward (``g``) and one
backward (``f``). ``VocabParallelEmbedding`` splits the vocabulary.

Initialisation is reproducible against an unsharded model: each rank builds the *full* weight with the
plain initialiser from the current RNG state (as Megatron's ``_initialize_affine_weight_cpu``) and keeps
its slice, so a layer built under ``torch.manual_seed(s)`` holds exactly the shard of what an unsharded
layer built under the same seed holds.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)


def init_method_linear_default(weight: torch.Tensor) -> torch.Tensor:
    """``nn.Linear``'s default initialiser (kaiming-uniform with a=sqrt(5)) on the full weight."""
    return nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


def init_method_normal(sigma: float):
    """Megatron's ``init_method_normal``: N(0, sigma)."""
    return lambda w: nn.init.normal_(w, mean=0.0, std=sigma)


def scaled_init_method_normal(sigma: float, num_layers: int, multiplier: float = 2.0):
    """Megatron's output-layer initialiser: N(0, sigma / sqrt(multiplier * num_layers))."""
    return init_method_normal(sigma / math.sqrt(multiplier * num_layers))


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


_MODEL_PARALLEL_ATTRIBUTE_DEFAULTS = {"tensor_model_parallel": False, "partition_dim": -1, "partition_stride": 1}


def set_defaults_if_not_set_tensor_model_parallel_attributes(tensor: torch.Tensor) -> None:
    for attribute, value in _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS.items():
        if not hasattr(tensor, attribute):
            setattr(tensor, attribute, value)


def copy_tensor_model_parallel_attributes(destination_tensor: torch.Tensor, source_tensor: torch.Tensor) -> None:
    for attribute in _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS:
        if hasattr(source_tensor, attribute):
            setattr(destination_tensor, attribute, getattr(source_tensor, attribute))


def param_is_not_tensor_parallel_duplicate(param) -> bool:
    """True on the one TP rank that should count a replicated parameter (e.g. for the grad norm)."""
    return getattr(param, "tensor_model_parallel", False) or ps.get_tensor_model_parallel_rank() == 0


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})")
    return numerator // denominator


def _perform_initialization(config) -> bool:
    return bool(getattr(config, "perform_initialization", True))


def _initialize_affine_weight_cpu(weight, full_shape, per_partition_size, partition_dim, init_method, stride=1,
                                  perform_initialization: bool = True):
    """Initialise the full weight, then keep this rank's (strided) slice along ``partition_dim``.

    ``stride > 1`` is for fused weights such as [gate; up]: the full dim is cut into ``stride * tp``
    chunks and rank r keeps chunks r, r + tp, ... so it holds [gate_r; up_r].
    """
    set_tensor_model_parallel_attributes(weight, True, partition_dim, stride)
    if not perform_initialization:  # Megatron's perform_initialization=False: left as allocated (to be loaded)
        return None
    master = torch.empty(full_shape, dtype=torch.float32)
    init_method(master)
    master = master.to(weight.dtype)
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    chunks = torch.split(master, per_partition_size // stride, dim=partition_dim)
    with torch.no_grad():
        weight.copy_(torch.cat(chunks[rank::tp], dim=partition_dim))
    return master


class ColumnParallelLinear(nn.Module):
    """``Y = XA + b`` with ``A`` split along its columns; returns ``(output, output_bias)`` like Megatron.

    Without SP the input passes through ``f`` (all-reduce of its gradient); with SP it is all-gathered
    along the sequence (and the gradient reduce-scattered). ``gather_output`` all-gathers the result.
    """

    def __init__(self, input_size: int, output_size: int, *, config=None, init_method=None, bias: bool = True,
                 gather_output: bool = False, stride: int = 1, skip_bias_add: bool = False,
                 sequence_parallel: bool | None = None, params_dtype=None, skip_weight_param_allocation: bool = False):
        super().__init__()
        if sequence_parallel is None:
            sequence_parallel = bool(getattr(config, "sequence_parallel", False))
        if sequence_parallel and gather_output:
            raise ValueError("ColumnParallelLinear: gather_output=True is incompatible with sequence_parallel=True")
        if init_method is None:
            init_method = getattr(config, "init_method", None) or init_method_linear_default
        dtype = params_dtype or getattr(config, "params_dtype", None) or torch.float32
        tp = ps.get_tensor_model_parallel_world_size()
        self.input_size, self.output_size = input_size, output_size
        self.output_size_per_partition = _divide(output_size, tp, "ColumnParallelLinear output_size")
        if self.output_size_per_partition % stride:
            raise ValueError(f"output_size per partition ({self.output_size_per_partition}) not divisible by "
                             f"stride ({stride})")
        self.gather_output, self.skip_bias_add, self.sequence_parallel = gather_output, skip_bias_add, sequence_parallel
        if skip_weight_param_allocation:  # the weight is passed to forward (tied output embedding)
            self.register_parameter("weight", None)
        else:
            self.weight = nn.Parameter(torch.empty(self.output_size_per_partition, input_size, dtype=dtype))
            _initialize_affine_weight_cpu(self.weight, (output_size, input_size), self.output_size_per_partition, 0,
                                          init_method, stride, _perform_initialization(config))
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.output_size_per_partition, dtype=dtype))
            set_tensor_model_parallel_attributes(self.bias, True, 0, stride)
        else:
            self.register_parameter("bias", None)

    def forward(self, input_, weight: torch.Tensor | None = None):
        if weight is None:
            weight = self.weight
        if weight is None:
            raise ValueError("ColumnParallelLinear built with skip_weight_param_allocation needs forward(weight=...)")
        if self.sequence_parallel:
            input_parallel = gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=True)
        else:
            input_parallel = copy_to_tensor_model_parallel_region(input_)
        bias = None if self.skip_bias_add else self.bias
        output = F.linear(input_parallel, weight, bias)
        if self.gather_output:
            output = gather_from_tensor_model_parallel_region(output)
        return output, (self.bias if self.skip_bias_add else None)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size}, out_per_partition={self.output_size_per_partition}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """``Y = XA + b`` with ``A`` split along its rows; partial sums meet in ``g`` (all-reduce),
    or with SP in a reduce-scatter along the sequence. The bias is added once, after the reduction."""

    def __init__(self, input_size: int, output_size: int, *, config=None, init_method=None, bias: bool = True,
                 input_is_parallel: bool = False, skip_bias_add: bool = False, stride: int = 1,
                 sequence_parallel: bool | None = None, params_dtype=None):
        super().__init__()
        if sequence_parallel is None:
            sequence_parallel = bool(getattr(config, "sequence_parallel", False))
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True needs input_is_parallel=True")
        if init_method is None:
            init_method = getattr(config, "output_layer_init_method", None) or init_method_linear_default
        dtype = params_dtype or getattr(config, "params_dtype", None) or torch.float32
        tp = ps.get_tensor_model_parallel_world_size()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = _divide(input_size, tp, "RowParallelLinear input_size")
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_partition, dtype=dtype))
        _initialize_affine_weight_cpu(self.weight, (output_size, input_size), self.input_size_per_partition, 1,
                                      init_method, stride, _perform_initialization(config))
        if bias:
            self.bias = nn.Parameter(torch.zeros(output_size, dtype=dtype))
            # replicated; with SP each rank's gradient covers only its sequence chunk -> all-reduced over TP
            self.bias.sequence_parallel = sequence_parallel
        else:
            self.register_parameter("bias", None)

    def forward(self, input_):
        input_parallel = input_ if self.input_is_parallel else scatter_to_tensor_model_parallel_region(input_)
        output_parallel = F.linear(input_parallel, self.weight)
        if self.sequence_parallel:
            output = reduce_scatter_to_sequence_parallel_region(output_parallel)
        else:
            output = reduce_from_tensor_model_parallel_region(output_parallel)
        if self.skip_bias_add or self.bias is None:
            return output, self.bias
        return output + self.bias, None

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, in_per_partition={self.input_size_per_partition}, out={self.output_size}, "
                f"sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(nn.Module):
    """Embedding with the vocabulary split over TP ranks; rows outside this rank's range read as zero
    and the partial lookups are summed with ``g`` (or, with ``reduce_scatter_embeddings``, reduce-scattered
    along the sequence straight into SP's layout, returned as ``[s, b, h]``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, init_method=None, config=None,
                 reduce_scatter_embeddings: bool = False, params_dtype=None):
        super().__init__()
        if init_method is None:
            init_method = getattr(config, "init_method", None) or nn.init.normal_
        dtype = params_dtype or getattr(config, "params_dtype", None) or torch.float32
        tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.num_embeddings_per_partition = _divide(num_embeddings, tp, "VocabParallelEmbedding num_embeddings")
        self.vocab_start_index = rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.reduce_scatter_embeddings = reduce_scatter_embeddings
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim, dtype=dtype))
        _initialize_affine_weight_cpu(self.weight, (num_embeddings, embedding_dim), self.num_embeddings_per_partition,
                                      0, init_method, perform_initialization=_perform_initialization(config))

    def forward(self, input_):
        if ps.get_tensor_model_parallel_world_size() > 1:
            mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
            local = (input_ - self.vocab_start_index).masked_fill(mask, 0)
        else:
            mask, local = None, input_
        output_parallel = F.embedding(local, self.weight)
        if mask is not None:
            output_parallel = output_parallel.masked_fill(mask.unsqueeze(-1), 0.0)
        if self.reduce_scatter_embeddings:
            return reduce_scatter_to_sequence_parallel_region(output_parallel.transpose(0, 1).contiguous())
        return reduce_from_tensor_model_parallel_region(output_parallel)
