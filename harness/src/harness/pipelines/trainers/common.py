"""What every training path shares: the model built with hf-lite, rank-sharded batches, the averaged loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from harness.pipelines.corpus import blocks
from harness.pipelines.presets import ModelPreset, TrainSpec


def spec_of(spec: dict) -> TrainSpec:
    """The spec as the rank received it (a dict), and the rank's setup: tqdm bars lock with a thread lock, not a
    multiprocessing one (a rank is killed once it has returned, and a semaphore it created would be reported as
    leaked by the resource tracker it shares with the launcher)."""
    import threading

    from tqdm.auto import tqdm

    tqdm.set_lock(threading.RLock())
    model = spec["model"] if isinstance(spec["model"], ModelPreset) else ModelPreset(**spec["model"])
    return TrainSpec(**{**spec, "model": model})


def build_model(spec: TrainSpec):
    """A Llama-style causal LM from hf-lite, initialised from the spec's seed (identical on every rank)."""
    from hf_lite import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(LlamaConfig(**spec.model.llama_config(spec.bos_token_id, spec.eos_token_id)))


def training_blocks(spec: TrainSpec) -> torch.Tensor:
    return blocks(torch.load(Path(spec.out_dir) / "tokens.pt"), spec.model.seq_length)


def rank_batch(data: torch.Tensor, step: int, rank: int, world_size: int, spec: TrainSpec) -> torch.Tensor:
    """This rank's micro-batch of step ``step``: a seeded permutation per epoch, cut into world_size shards."""
    per_step = spec.micro_batch_size * world_size
    steps_per_epoch = max(1, data.shape[0] // per_step)
    epoch, within = divmod(step, steps_per_epoch)
    order = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(spec.seed + epoch))
    start = within * per_step + rank * spec.micro_batch_size
    return data[order[start : start + spec.micro_batch_size]]


def mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t[0])


def finish_checkpoint(spec: TrainSpec) -> None:
    """Complete the Hugging Face directory a converter wrote: tokenizer files and generation_config.json."""
    out = Path(spec.checkpoint_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        src = Path(spec.tokenizer_dir) / name
        if src.exists() and not (out / name).exists():
            shutil.copy(src, out / name)
    gen = out / "generation_config.json"
    if not gen.exists():
        gen.write_text(json.dumps({"bos_token_id": spec.bos_token_id, "eos_token_id": spec.eos_token_id}, indent=2))
    config = json.loads((out / "config.json").read_text())
    if config.get("eos_token_id") is None or config.get("bos_token_id") is None:
        config.update(bos_token_id=spec.bos_token_id, eos_token_id=spec.eos_token_id)
        (out / "config.json").write_text(json.dumps(config, indent=2))
