"""Data parallelism: torch's DDP and FSDP2 (the peers), pt-dist's DDP and FSDP (FULL_SHARD), on hf-lite's Llama.

Every rank trains on its slice of the global batch with AdamW; gradients are bucket views (``gradient_as_bucket_view``)
so a DDP rank holds one copy of them, as the ZeRO paper's baseline assumes. torch's DDP reduces through torch's own
``allreduce_hook`` (the same all-reduce as its C++ default, but made from Python where the counter sees it).
"""

from __future__ import annotations

import torch

from harness.pipelines.compare.memory import optimizer_state_tensors, tensor_bytes
from harness.pipelines.compare.strategies import Handle, llama, local_batch, num_params, spec_of


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _snapshot(params, optimizer) -> dict:
    params = list(params)
    return {
        "parameters": tensor_bytes(_local(p.detach()) for p in params),
        "gradients": tensor_bytes(_local(p.grad) for p in params if p.grad is not None),
        "optimizer_states": tensor_bytes(_local(t) for t in optimizer_state_tensors(optimizer)),
    }


def _handle(spec, rank, world_size, wrapped, params, psi, close=lambda: None) -> Handle:
    params = list(params)
    optimizer = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    last = {}

    def step(i: int) -> float:
        x = local_batch(spec, i, rank, world_size)
        loss = wrapped(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        last.update(_snapshot(params, optimizer))
        optimizer.zero_grad(set_to_none=False)  # the gradient buffers stay allocated, as DDP's buckets do
        return float(loss)

    return Handle(step=step, memory=lambda: dict(last), num_params=psi, close=close)


def _pt_dist_group(rank, world_size, counter):
    import pt_dist

    from harness.pipelines.trainers.pt_dist import _join

    _join(rank, world_size)
    return counter.wrap_pt_dist(pt_dist.group.WORLD)


def _pt_dist_close():
    import pt_dist

    pt_dist.destroy_process_group()


def setup_torch_ddp(rank, world_size, cfg, counter) -> Handle:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    spec = spec_of(cfg)
    model = llama(spec)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True, broadcast_buffers=False)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    return _handle(spec, rank, world_size, ddp, model.parameters(), num_params(model))


def setup_pt_dist_ddp(rank, world_size, cfg, counter) -> Handle:
    import pt_dist

    spec = spec_of(cfg)
    model = llama(spec)
    group = _pt_dist_group(rank, world_size, counter)
    ddp = pt_dist.DistributedDataParallel(model, process_group=group, gradient_as_bucket_view=True,
                                          broadcast_buffers=False)
    return _handle(spec, rank, world_size, ddp, model.parameters(), num_params(model), close=_pt_dist_close)


def setup_pt_dist_fsdp(rank, world_size, cfg, counter) -> Handle:
    from hf_lite.models.llama.modeling_llama import LlamaDecoderLayer
    from pt_dist.fsdp import FullyShardedDataParallel, ModuleWrapPolicy, ShardingStrategy

    spec = spec_of(cfg)
    model = llama(spec)
    psi = num_params(model)
    group = _pt_dist_group(rank, world_size, counter)
    fsdp = FullyShardedDataParallel(model, process_group=group, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                    auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
    return _handle(spec, rank, world_size, fsdp, fsdp.parameters(), psi, close=_pt_dist_close)


def setup_torch_fsdp2(rank, world_size, cfg, counter) -> Handle:
    from torch.distributed.fsdp import fully_shard

    spec = spec_of(cfg)
    model = llama(spec)
    psi = num_params(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return _handle(spec, rank, world_size, model, model.parameters(), psi)
