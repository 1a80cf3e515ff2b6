"""The peer: DeepSpeed's own ZeRO engine (its CPU accelerator) on the same model, batch and JSON as ds-zero's.

Its collectives go through ``deepspeed.comm`` to ``torch.distributed``, where the counter sees them. Memory is
counted from the flat buffers DeepSpeed keeps (its 16-bit flat groups or stage-3 partitions, its fp32 partitions,
the wrapped optimizer's state and the gradient partitions alive after backward), by summed tensor bytes.
"""

from __future__ import annotations

from harness.pipelines.compare.memory import optimizer_state_tensors, tensor_bytes
from harness.pipelines.compare.strategies import Handle, llama, local_batch, num_params, spec_of
from harness.pipelines.compare.strategies.zero import ds_config


def _memory(opt, stage: int, grads: list) -> dict:
    if stage == 3:
        params = list(opt.fp16_partitioned_groups_flat)
        master = list(opt.fp32_partitioned_groups_flat)
    else:
        params = list(opt.bit16_groups_flat)
        master = list(opt.single_partition_of_fp32_groups)
    return {"parameters": tensor_bytes(params), "gradients": tensor_bytes(grads),
            "optimizer_states": tensor_bytes(master + optimizer_state_tensors(opt.optimizer))}


def _grads_after_backward(opt, stage: int) -> list:
    out = []
    for group in getattr(opt, "averaged_gradients", {}).values():
        out.extend(g for g in (group or []) if g is not None)
    if stage == 3 and getattr(opt, "grad_partitions_flat_buffer", None) is not None:
        out.append(opt.grad_partitions_flat_buffer)
    return out


def _setup(rank, world_size, cfg, stage: int) -> Handle:
    import deepspeed
    import deepspeed.ops

    spec = spec_of(cfg)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # its shm all-reduce needs a C++ build
    config = ds_config(spec, world_size, stage)
    config["optimizer"]["params"]["torch_adam"] = True  # FusedAdam is CUDA-only
    model = llama(spec)
    psi = num_params(model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    last = {}

    def step(i: int) -> float:
        x = local_batch(spec, i, rank, world_size)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        grads = _grads_after_backward(engine.optimizer, stage)
        engine.step()
        last.update(_memory(engine.optimizer, stage, grads))
        return float(loss)

    return Handle(step=step, memory=lambda: dict(last), num_params=psi)


def setup_stage2(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 2)


def setup_stage3(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 3)
