"""ZeRO stages 1-3 (and stage 2 with its optimizer offloaded to the CPU) with ds-zero's engine, on hf-lite's Llama.

Memory comes from ds-zero's own accounting (``ds_zero.memory.memory_breakdown``: summed bytes of the tensors each
stage keeps); ``stage3_param_persistence_threshold`` is 0 so stage 3 partitions every parameter, as the paper's
formula assumes. Buckets are large enough that each step's reduction and gathering are whole-model operations.
On gloo ds-zero all-reduces gradient buckets (faster there than gloo's reduce / reduce-scatter); the option
``zero_collectives="owner"`` (the default here) makes it reduce to the owners only, the paper's algorithm.
"""

from __future__ import annotations

from harness.pipelines.compare.strategies import Handle, llama, local_batch, num_params, spec_of


def ds_config(spec, world_size: int, stage: int, offload: str = "none") -> dict:
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 50_000_000,
            "allgather_bucket_size": 50_000_000, "stage3_prefetch_bucket_size": 50_000_000}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    return {
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": spec.micro_batch_size * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": spec.lr, "weight_decay": 0.0}},
        "zero_optimization": zero,
    }


def _setup(rank, world_size, cfg, stage: int, offload: str = "none") -> Handle:
    import ds_zero
    from ds_zero.memory import memory_breakdown
    from ds_zero.runtime.zero import reduce_scatter

    spec = spec_of(cfg)
    reduce_scatter.OWNER_ONLY_COLLECTIVES_ON_GLOO = spec.options.get("zero_collectives", "owner") == "owner"
    model = llama(spec)
    psi = num_params(model)
    engine, *_ = ds_zero.initialize(model=model, config=ds_config(spec, world_size, stage, offload))
    last = {}

    def step(i: int) -> float:
        x = local_batch(spec, i, rank, world_size)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        bd = memory_breakdown(engine)
        last.update({k: bd[k] for k in ("parameters", "gradients", "optimizer_states")})
        last["offload"] = bd["offload"]["cpu"]["total"] + bd["offload"]["nvme"].get("total", 0)
        return float(loss)

    return Handle(step=step, memory=lambda: dict(last), num_params=psi, close=engine.destroy)


def setup_stage1(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 1)


def setup_stage2(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 2)


def setup_stage3(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 3)


def setup_stage2_offload(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 2, "cpu")
