"""Enumerations of ``megatron/core/transformer/enums.py`` that mega_par's specs use."""

from __future__ import annotations

import enum


class AttnMaskType(enum.Enum):
    """What mask an attention module applies when ``attention_mask`` is None (``causal``: the lower
    triangle); a mask given to forward is used as it is, as Megatron's unfused softmax does."""

    padding = 1
    causal = 2
    no_mask = 3
    padding_causal = 4
    arbitrary = 5


class AttnType(enum.Enum):
    self_attn = 1
    cross_attn = 2


class AttnBackend(enum.Enum):
    """Which attention kernel Megatron picks; mega_par has one, the unfused ``local`` path."""

    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5
