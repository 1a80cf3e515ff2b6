"""Megatron's distributed optimizer: optimizer state sharded over the data-parallel group (ZeRO-1).

Each DP rank owns ``1/dp`` of every gradient bucket. After DDP's reduce-scatter it holds the averaged
gradient of its shard; it keeps an fp32 master copy of that shard of the parameters and the optimizer
state (Adam moments) only for it, steps, then all-gathers the updated shards back into the parameter
buffer so every replica ends the step with the full model. As Megatron's ``_build_model_gbuf_range_map``,
a shard is cut at parameter boundaries into pieces (one master tensor each), so each piece knows its
parameter: whether it counts in the grad norm and whether it takes weight decay. The element-wise
optimizers (Adam, SGD) update a piece exactly as they would update the slice of the whole parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps
from mega_par.optimizer.optimizer import (
    MegatronOptimizer,
    build_torch_optimizer,
    clip_coefficient,
    default_no_weight_decay_cond,
    get_grad_norm_fp32,
    param_is_not_shared,
)
from mega_par.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate


@dataclass
class _Piece:
    """Elements ``[lo, hi)`` of a bucket that belong to one parameter and to this rank's shard."""

    bucket: object
    lo: int
    hi: int
    main: torch.nn.Parameter  # fp32 master copy of those elements
    in_grad_norm: bool
    weight_decay: bool


class DistributedOptimizer(MegatronOptimizer):
    def __init__(self, config, model_chunks, no_weight_decay_cond=None):
        self.config, self.model_chunks = config, list(model_chunks)
        for m in self.model_chunks:
            if not getattr(getattr(m, "ddp_config", None), "use_distributed_optimizer", False):
                raise ValueError("DistributedOptimizer needs model chunks wrapped in DistributedDataParallel "
                                 "with DistributedDataParallelConfig(use_distributed_optimizer=True)")
        cond = no_weight_decay_cond or default_no_weight_decay_cond
        self.params = [p for m in self.model_chunks for p in m.parameters() if p.requires_grad]
        self.shards = []  # (bucket, start, end): this rank's range of each bucket, all-gathered after the step
        self.pieces: list[_Piece] = []
        for m in self.model_chunks:
            names = {p: n for n, p in m.named_parameters()}
            dp_rank = dist.get_rank(m.data_parallel_group)
            for bucket in m.buffer.buckets:
                start, end = bucket.shard_range(dp_rank)
                self.shards.append((bucket, start, end))
                for p in bucket.params:
                    p_start, p_end = (i - bucket.offset for i in m.buffer.param_index_map[p])
                    lo, hi = max(start, p_start), min(end, p_end)
                    if lo >= hi:
                        continue
                    main = torch.nn.Parameter(bucket.param_data[lo:hi].detach().float().clone())
                    counted = param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)
                    self.pieces.append(_Piece(bucket, lo, hi, main, counted, not cond(names[p], p)))
        groups = [{"params": [x.main for x in self.pieces if x.weight_decay], "weight_decay": config.weight_decay},
                  {"params": [x.main for x in self.pieces if not x.weight_decay], "weight_decay": 0.0}]
        self.optimizer = build_torch_optimizer(config, [g for g in groups if g["params"]])

    def get_grad_norm(self) -> float:
        device = self.pieces[0].main.device if self.pieces else "cpu"
        sq = torch.zeros((), dtype=torch.float32, device=device)
        for x in self.pieces:
            if x.in_grad_norm:
                sq += x.bucket.grad_data[x.lo:x.hi].float().pow(2).sum()
        return get_grad_norm_fp32(sq, [ps.get_data_parallel_group(), ps.get_model_parallel_group()])

    @torch.no_grad()
    def step(self):
        grad_norm = self.get_grad_norm()
        coeff = clip_coefficient(grad_norm, self.config.clip_grad)
        for x in self.pieces:
            g = x.bucket.grad_data[x.lo:x.hi].float()
            x.main.grad = g * coeff if coeff is not None else g.clone()
        if self.optimizer is not None:
            self.optimizer.step()
        for x in self.pieces:
            x.main.grad = None
            x.bucket.param_data[x.lo:x.hi].copy_(x.main)
        for bucket, start, end in self.shards:
            if bucket.data_parallel_world_size > 1:
                gathered = torch.empty_like(bucket.param_data)
                dist.all_gather_into_tensor(gathered, bucket.param_data[start:end].contiguous(),
                                            group=bucket.data_parallel_group)
                bucket.param_data.copy_(gathered)
        return True, grad_norm, None

    def get_main_grads_for_grad_norm(self) -> list:
        return [x.bucket.grad_data[x.lo:x.hi] for x in self.pieces if x.in_grad_norm]

    @torch.no_grad()
    def clip_grad_norm(self, clip_grad: float) -> float:
        """As ``MegatronOptimizer``'s, over the gradient buffers (each DP rank scales its whole buffer alike)."""
        norm = self.get_grad_norm()
        coeff = clip_coefficient(norm, clip_grad)
        if coeff is not None:
            for bucket, _, _ in self.shards:
                bucket.grad_data.mul_(coeff)
        return norm

    def count_zeros(self) -> float:
        n = torch.zeros((), dtype=torch.float32)
        for g in self.get_main_grads_for_grad_norm():
            n += g.numel() - torch.count_nonzero(g).item()
        for group in (ps.get_data_parallel_group(), ps.get_model_parallel_group()):
            if dist.get_world_size(group) > 1:
                dist.all_reduce(n, group=group)
        return float(n)

    @torch.no_grad()
    def reload_model_params(self) -> None:
        """The fp32 master pieces from the model's parameters again (after the model was loaded)."""
        for x in self.pieces:
            x.main.copy_(x.bucket.param_data[x.lo:x.hi])

    def sharded_state_dict(self) -> dict:
        """This rank's shard of the optimizer state and master weights (saved per rank)."""
        return {"optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
                "main_params": [x.main.detach().clone() for x in self.pieces]}

    def state_dict(self):
        return self.sharded_state_dict()

    def load_state_dict(self, state_dict) -> None:
        if len(state_dict["main_params"]) != len(self.pieces):
            raise ValueError(f"distributed-optimizer shard holds {len(state_dict['main_params'])} master pieces, "
                             f"this rank has {len(self.pieces)}: saved with another layout or bucket size")
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state_dict["optimizer"])
        with torch.no_grad():
            for x, saved in zip(self.pieces, state_dict["main_params"]):
                x.main.copy_(saved)
