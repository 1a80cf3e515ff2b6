"""``MegatronModule`` (``megatron/core/transformer/module.py``): the base of Megatron's modules, an ``nn.Module``
that carries its ``TransformerConfig``."""

from __future__ import annotations

from torch import nn


class MegatronModule(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False) -> dict:
        return self.state_dict(prefix=prefix, keep_vars=keep_vars)

    def set_is_first_microbatch(self) -> None:
        """Megatron resets FP8 weight caches here; mega_par has none to reset."""
