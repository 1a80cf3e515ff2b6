"""Tensor-parallel linear layers (vLLM ``model_executor/layers/linear.py``; Megatron-LM, arXiv:1909.08053 §3).

A column-parallel layer keeps rank r's slice of the output features (its heads, its part of the MLP), so its output
stays split; a row-parallel layer keeps the same slice of the input features and all-reduces its partial sums, so
its output is whole again. Each layer has a ``weight_loader`` that cuts the rank's slice out of the checkpoint's
full tensor while it loads; given a lazy safetensors slice, only that slice is read from the file. At one rank
every layer is a plain ``nn.Linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paged_serve.distributed.parallel_state import get_tp_group


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor parallel size {denominator}")
    return numerator // denominator


def narrow(loaded, dim: int, start: int, size: int) -> torch.Tensor:
    """``loaded[..., start:start + size, ...]`` along ``dim``, of a tensor or a lazy safetensors slice."""
    shape = loaded.shape if isinstance(loaded, torch.Tensor) else loaded.get_shape()
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, start + size)
    return loaded[tuple(index)]


def default_weight_loader(param: torch.Tensor, loaded_weight) -> None:
    """The whole tensor into ``param`` (replicated parameters: norms, row-parallel biases)."""
    loaded = loaded_weight if isinstance(loaded_weight, torch.Tensor) else loaded_weight[:]
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded.shape)} != parameter shape {tuple(param.shape)}")
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, skip_bias_add: bool = False,
                 params_dtype: torch.dtype | None = None):  # fmt: skip
        super().__init__()
        self.tp_group = get_tp_group()  # the group this model was built for, even if another engine's comes later
        self.tp_rank, self.tp_size = self.tp_group.rank, self.tp_group.world_size
        self.input_size, self.output_size, self.skip_bias_add = input_size, output_size, skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()

    def _params(self, out_features: int, in_features: int, bias_features: int | None) -> None:
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=self.params_dtype))
        bias = torch.empty(bias_features, dtype=self.params_dtype) if bias_features else None
        self.bias = nn.Parameter(bias) if bias is not None else None


class ColumnParallelLinear(LinearBase):
    """``Y = X A`` with ``A`` split by columns: rank r holds ``A_r`` and computes ``Y_r`` (output split)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None):  # fmt: skip
        super().__init__(input_size, output_size, bias, skip_bias_add, params_dtype)
        self.gather_output = gather_output
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self._params(self.output_size_per_partition, input_size, self.output_size_per_partition if bias else None)

    def weight_loader(self, param: nn.Parameter, loaded_weight) -> None:
        size = param.shape[0]
        default_weight_loader(param, narrow(loaded_weight, 0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor):
        out = F.linear(x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            out = self.tp_group.all_gather(out)
        return out, (self.bias if self.skip_bias_add else None)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (Llama's gate and up projections); each rank keeps its slice
    of every one, so ``gate_r | up_r`` sit side by side."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None):  # fmt: skip
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, gather_output, skip_bias_add, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded_weight, loaded_shard_id: int | None = None) -> None:
        if loaded_shard_id is None:  # a checkpoint that stores them fused (Phi-3's gate_up_proj)
            start = 0
            for shard_id, size in enumerate(self.output_sizes):
                self.weight_loader(param, narrow(loaded_weight, 0, start, size), shard_id)
                start += size
            return
        offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        size = self.output_sizes[loaded_shard_id] // self.tp_size
        default_weight_loader(param.data.narrow(0, offset, size), narrow(loaded_weight, 0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q/k/v projection split by heads: rank r holds its query heads and their key/value heads. With
    fewer KV heads than ranks, each KV head is replicated on ``tp_size / total_num_kv_heads`` ranks (vLLM's rule)."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int | None = None,
                 bias: bool = True, skip_bias_add: bool = False, params_dtype: torch.dtype | None = None):  # fmt: skip
        tp_size = get_tp_group().world_size
        self.head_size, self.total_num_heads = head_size, total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, divide(tp_size, self.total_num_kv_heads)
        else:
            self.num_kv_heads, self.num_kv_head_replicas = divide(self.total_num_kv_heads, tp_size), 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias, False, skip_bias_add, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded_weight, loaded_shard_id: str | None = None) -> None:
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if loaded_shard_id is None:  # a fused checkpoint tensor (GPT-2's c_attn, Phi-3's qkv_proj): q | k | v
            total_q, total_kv = self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size
            for shard_id, start, size in (("q", 0, total_q), ("k", total_q, total_kv), ("v", total_q + total_kv,
                                                                                       total_kv)):  # fmt: skip
                self.weight_loader(param, narrow(loaded_weight, 0, start, size), shard_id)
            return
        kv_rank = self.tp_rank // self.num_kv_head_replicas
        offset, size, rank = {"q": (0, q, self.tp_rank), "k": (q, kv, kv_rank), "v": (q + kv, kv, kv_rank)}[
            loaded_shard_id]  # fmt: skip
        default_weight_loader(param.data.narrow(0, offset, size), narrow(loaded_weight, 0, rank * size, size))


class RowParallelLinear(LinearBase):
    """``Y = X A`` with ``A`` split by rows: rank r multiplies its input slice ``X_r`` by ``A_r``; the all-reduce
    sums the partial products (Megatron's ``g``). The bias is whole on every rank and added once."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, input_is_parallel: bool = True,
                 skip_bias_add: bool = False, params_dtype: torch.dtype | None = None,
                 reduce_results: bool = True):  # fmt: skip
        super().__init__(input_size, output_size, bias, skip_bias_add, params_dtype)
        self.input_is_parallel, self.reduce_results = input_is_parallel, reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self._params(output_size, self.input_size_per_partition, output_size if bias else None)

    def weight_loader(self, param: nn.Parameter, loaded_weight) -> None:
        if param.dim() == 1:
            return default_weight_loader(param, loaded_weight)
        size = param.shape[1]
        default_weight_loader(param, narrow(loaded_weight, 1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor):
        if not self.input_is_parallel:
            x = x.chunk(self.tp_size, dim=-1)[self.tp_rank]
        bias = None if self.tp_rank > 0 or self.skip_bias_add else self.bias  # added once: on rank 0, before the sum
        out = F.linear(x, self.weight, bias)
        if self.reduce_results and self.tp_size > 1:
            out = self.tp_group.all_reduce(out)
        return out, (self.bias if self.skip_bias_add else None)
