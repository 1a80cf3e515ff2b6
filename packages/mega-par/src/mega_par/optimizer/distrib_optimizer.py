"""Megatron's distributed optimizer: optimizer state sharded over the data-parallel group (ZeRO-1).

Each DP rank owns ``1/dp`` of every gradient bucket. After DDP's reduce-scatter it holds the averaged
gradient of its shard; it keeps an fp32 master copy of that shard of the parameters and the optimizer
state (Adam moments) only for it, steps, then all-gathers the updated shards back into the parameter
buffer so every replica ends the step with the full model. The element-wise optimizers (Adam, SGD)
update a flat shard exactly as they would update the whole parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps
from mega_par.optimizer.optimizer import (
    MegatronOptimizer,
    build_torch_optimizer,
    clip_coefficient,
    get_grad_norm_fp32,
    param_is_not_shared,
)
from mega_par.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate


class DistributedOptimizer(MegatronOptimizer):
    def __init__(self, config, model_chunks):
        self.config, self.model_chunks = config, list(model_chunks)
        for m in self.model_chunks:
            if not getattr(getattr(m, "ddp_config", None), "use_distributed_optimizer", False):
                raise ValueError("DistributedOptimizer needs model chunks wrapped in DistributedDataParallel "
                                 "with DistributedDataParallelConfig(use_distributed_optimizer=True)")
        self.params = [p for m in self.model_chunks for p in m.parameters() if p.requires_grad]
        self.shards = []  # (bucket, start, end, main_param, count_mask)
        for m in self.model_chunks:
            group = m.data_parallel_group
            dp_rank = dist.get_rank(group)
            for bucket in m.buffer.buckets:
                start, end = bucket.shard_range(dp_rank)
                main = torch.nn.Parameter(bucket.param_data[start:end].detach().float().clone())
                self.shards.append((bucket, start, end, main, self._norm_mask(bucket, start, end)))
        self.optimizer = build_torch_optimizer(config, [s[3] for s in self.shards])

    @staticmethod
    def _norm_mask(bucket, start, end) -> torch.Tensor:
        """1 where the element belongs to a parameter counted in the global grad norm, else 0 (and padding)."""
        mask = torch.zeros(bucket.grad_data.numel(), dtype=torch.float32, device=bucket.grad_data.device)
        offset = 0
        for p in bucket.params:
            if param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p):
                mask[offset:offset + p.numel()] = 1.0
            offset += p.numel()
        return mask[start:end]

    def get_grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float32, device=self.shards[0][0].grad_data.device if self.shards else "cpu")
        for bucket, start, end, _, mask in self.shards:
            sq += (bucket.grad_data[start:end].float().pow(2) * mask).sum()
        return get_grad_norm_fp32(sq, [ps.get_data_parallel_group(), ps.get_model_parallel_group()])

    @torch.no_grad()
    def step(self):
        grad_norm = self.get_grad_norm()
        coeff = clip_coefficient(grad_norm, self.config.clip_grad)
        for bucket, start, end, main, _ in self.shards:
            g = bucket.grad_data[start:end].float()
            main.grad = g * coeff if coeff is not None else g.clone()
        self.optimizer.step()
        for bucket, start, end, main, _ in self.shards:
            main.grad = None
            bucket.param_data[start:end].copy_(main)
            if bucket.data_parallel_world_size > 1:
                gathered = torch.empty_like(bucket.param_data)
                dist.all_gather_into_tensor(gathered, bucket.param_data[start:end].contiguous(),
                                            group=bucket.data_parallel_group)
                bucket.param_data.copy_(gathered)
        return True, grad_norm, None

    def sharded_state_dict(self) -> dict:
        """This rank's shard of the optimizer state and master weights (saved per rank)."""
        return {"optimizer": self.optimizer.state_dict(), "main_params": [s[3].detach().clone() for s in self.shards]}

    def state_dict(self):
        return self.sharded_state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        with torch.no_grad():
            for (_, _, _, main, _), saved in zip(self.shards, state_dict["main_params"]):
                main.copy_(saved)
