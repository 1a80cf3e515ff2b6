"""What ``generate(return_dict_in_generate=True)`` returns (transformers' ``generation/utils.py`` output classes),
in a module of their own so the greedy loop (``utils.py``) and ``beam_search.py`` both import them one way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling_outputs import ModelOutput


@dataclass
class GenerateDecoderOnlyOutput(ModelOutput):
    sequences: torch.LongTensor | None = None
    scores: tuple | None = None
    past_key_values: object | None = None


@dataclass
class GenerateBeamDecoderOnlyOutput(ModelOutput):
    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    scores: tuple | None = None
    beam_indices: torch.LongTensor | None = None
    past_key_values: object | None = None
