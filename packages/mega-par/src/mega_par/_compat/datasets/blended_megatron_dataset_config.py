"""``BlendedMegatronDatasetConfig`` and the split string (``megatron/core/datasets/
blended_megatron_dataset_config.py``): no blend means ``mock = True`` with split ``"1,1,1"``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Split(Enum):
    train = 0
    valid = 1
    test = 2


def parse_and_normalize_split(split: str) -> list[float]:
    """``"969,30,1"`` -> fractions summing to 1 (missing entries 0)."""
    try:
        vec = [float(s) for s in split.replace("/", ",").split(",")]
    except ValueError:
        raise ValueError(f"split {split!r} must be comma-separated numbers, e.g. '969,30,1'") from None
    if len(vec) > 3 or any(v < 0 for v in vec) or sum(vec) <= 0:
        raise ValueError(f"split {split!r} needs at most 3 non-negative numbers with a positive sum")
    vec += [0.0] * (3 - len(vec))
    return [v / sum(vec) for v in vec]


def convert_split_vector_to_split_matrix(vector_a: list[float], vector_b: list[float] | None = None) -> list:
    """Fractions -> ``[(begin, end)]`` bookends per split (None where a split is empty)."""
    if vector_b is not None:
        raise ValueError("convert_split_vector_to_split_matrix: vector_b is not supported by mega_par")
    bounds, acc = [], 0.0
    for v in vector_a:
        bounds.append((acc, acc + v) if v > 0 else None)
        acc += v
    return bounds


@dataclass
class BlendedMegatronDatasetConfig:
    """Upstream's fields for what mega_par builds (blends, splits, the tokenizer, the surplus)."""

    random_seed: int
    sequence_length: int
    blend: tuple | None = None
    blend_per_split: list | None = None
    multiple_validation_sets: bool | None = None
    full_validation: bool | None = None
    split: str | None = None
    split_matrix: list | None = field(init=False, default=None)
    num_dataset_builder_threads: int = 1
    path_to_cache: str | None = None
    mmap_bin_files: bool = True
    mock: bool = field(init=False, default=False)
    tokenizer: object = None
    mid_level_dataset_surplus: float = 0.005

    def __post_init__(self) -> None:
        if self.blend_per_split is not None and any(self.blend_per_split):
            if self.blend is not None or self.split is not None:
                raise ValueError("blend_per_split is incompatible with blend and split")
            if len(self.blend_per_split) != len(Split):
                raise ValueError(f"blend_per_split must contain {len(Split)} blends, got {len(self.blend_per_split)}")
            return
        if self.blend is not None:
            if self.blend[1] is not None and len(self.blend[0]) != len(self.blend[1]):
                raise ValueError(f"blend prefixes ({len(self.blend[0])}) and weights ({len(self.blend[1])}) "
                                 "must be equal in number")
            if self.split is None:
                raise ValueError("split must be provided when blend is not None")
        else:
            self.mock, self.split = True, "1,1,1"
        self.split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(self.split))
