"""One training step per strategy behind one interface, so the same measurement loop runs them all.

A strategy module exposes ``setup(rank, world_size, cfg, counter) -> Handle``. ``cfg`` is a :class:`CompareSpec`
as a dict; ``counter`` is the run's :class:`~harness.pipelines.compare.comm.CommCounter` (pt-dist groups are
instrumented with it at setup; torch-based code is counted while the counter is entered).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class CompareSpec:
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 352
    vocab_size: int = 2048
    seq_length: int = 64
    micro_batch_size: int = 4  # sequences per data-parallel rank per step (the global batch is world_size times)
    lr: float = 1e-3
    seed: int = 0
    options: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def global_batch(self, world_size: int) -> int:
        return self.micro_batch_size * world_size


@dataclass
class Handle:
    """``step(i) -> loss`` runs step ``i`` on the global batch ``tokens(i)``; ``memory() -> {kind: bytes}`` counts
    this rank's parameters, gradients and optimizer states (``offload``: bytes kept off the compute device)."""

    step: Callable[[int], float]
    memory: Callable[[], dict]
    num_params: int
    close: Callable[[], None] = lambda: None


def spec_of(cfg: dict) -> CompareSpec:
    return cfg if isinstance(cfg, CompareSpec) else CompareSpec(**cfg)


def tokens(spec: CompareSpec, step: int, world_size: int) -> torch.Tensor:
    """The global batch of step ``step``: ``[world_size * micro_batch_size, seq_length + 1]`` random token ids,
    the same for every strategy."""
    gen = torch.Generator().manual_seed(spec.seed * 7919 + step)
    return torch.randint(0, spec.vocab_size, (spec.global_batch(world_size), spec.seq_length + 1), generator=gen)


def llama(spec: CompareSpec):
    """The model every data-parallel strategy trains: hf-lite's Llama (multi-head attention, untied embeddings)."""
    from hf_lite import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers,
                         num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_attention_heads,
                         intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size,
                         max_position_embeddings=spec.seq_length + 1, tie_word_embeddings=False, rms_norm_eps=1e-5)
    return LlamaForCausalLM(config)


def num_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def local_batch(spec: CompareSpec, step: int, rank: int, world_size: int) -> torch.Tensor:
    x = tokens(spec, step, world_size)[:, :-1]
    b = spec.micro_batch_size
    return x[rank * b:(rank + 1) * b]
