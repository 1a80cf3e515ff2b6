"""Model outputs: dataclasses that also read like dicts/tuples, as transformers' ``ModelOutput``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

import torch


class ModelOutput(OrderedDict):
    """Dataclass whose non-None fields are also dict items, and indexable by position (``out[0]``)."""

    def __post_init__(self):
        first, *rest = fields(self)
        if isinstance(getattr(self, first.name), dict) and all(getattr(self, f.name) is None for f in rest):
            # ``type(out)(mapping)`` rebuilds an output from its items (accelerate's fp32 conversion does)
            items, _ = getattr(self, first.name), super().__setattr__(first.name, None)
            for key, value in items.items():
                setattr(self, key, value)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                super().__setitem__(f.name, value)

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.to_tuple()[key]

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if value is not None and name in {f.name for f in fields(self)}:
            super().__setitem__(name, value)

    def to_tuple(self) -> tuple:
        return tuple(self[k] for k in self.keys())

    @property
    def cache(self):
        """transformers 5's name of ``past_key_values``, on the outputs that have one."""
        return self.past_key_values


@dataclass
class BaseModelOutputWithPast(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    past_key_values: object | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class CausalLMOutputWithPast(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: object | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
