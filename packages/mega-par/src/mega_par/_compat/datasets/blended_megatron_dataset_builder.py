"""``BlendedMegatronDatasetBuilder(cls, sizes, is_built_on_rank, config).build()`` -> ``[train, valid, test]``
and the ``BlendedDataset`` it returns for a weighted blend (``megatron/core/datasets/
blended_megatron_dataset_builder.py``, ``blended_dataset.py``).

Each prefix's low-level dataset is cut into the split's document ranges; with weights, dataset ``k`` of the
blend gets ``ceil(w_k * size * (1 + mid_level_dataset_surplus))`` samples and the blend picks, for sample ``i``,
the dataset furthest behind its share (``w_k * (i + 1) - drawn_k`` largest: upstream's C++
``build_blending_indices``, in numpy here).
"""

from __future__ import annotations

import math

import numpy
import torch

from mega_par._compat.datasets.blended_megatron_dataset_config import Split


def build_blending_indices(weights, size: int):
    """``(dataset_index, dataset_sample_index)`` of length ``size``, each dataset's draws tracking its weight."""
    weights = numpy.asarray(weights, dtype=numpy.float64)
    drawn = numpy.zeros(len(weights), dtype=numpy.int64)
    dataset_index = numpy.empty(size, dtype=numpy.int16)
    dataset_sample_index = numpy.empty(size, dtype=numpy.int64)
    for i in range(size):
        k = int(numpy.argmax(weights * max(i, 1) - drawn))
        dataset_index[i], dataset_sample_index[i] = k, drawn[k]
        drawn[k] += 1
    return dataset_index, dataset_sample_index


class BlendedDataset(torch.utils.data.Dataset):
    """``size`` samples drawn from ``datasets`` in proportion to ``weights`` (upstream's constructor)."""

    def __init__(self, datasets, weights, size, config) -> None:
        if len(datasets) != len(weights) or size is None:
            raise ValueError(f"BlendedDataset: {len(datasets)} datasets, {len(weights)} weights, size {size}")
        total = float(sum(weights))
        self.datasets, self.weights, self.size, self.config = datasets, [w / total for w in weights], size, config
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, size)
        for k, d in enumerate(datasets):
            need = int((self.dataset_index == k).sum())
            if need > len(d):
                raise ValueError(f"BlendedDataset: dataset {k} has {len(d)} samples, the blend draws {need}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict:
        k = int(self.dataset_index[idx])
        return {"dataset_id": k, **self.datasets[k][int(self.dataset_sample_index[idx])]}


def _weights_and_prefixes(blend):
    prefixes, weights = blend
    return list(prefixes), (list(weights) if weights is not None else None)


class BlendedMegatronDatasetBuilder:
    """Upstream's builder: ``sizes[i]`` samples for split ``i`` (None: each dataset's own length, one epoch)."""

    def __init__(self, cls, sizes, is_built_on_rank, config) -> None:
        if len(sizes) != len(Split):
            raise ValueError(f"sizes must have one entry per split (train, valid, test), got {sizes}")
        self.cls, self.sizes, self.is_built_on_rank, self.config = cls, list(sizes), is_built_on_rank, config

    def build(self) -> list:
        if not self.is_built_on_rank():
            return [None] * len(Split)
        c = self.config
        if c.mock:
            return self._build_splits(None, self.sizes)
        if c.blend_per_split is not None and any(c.blend_per_split):
            out = []
            for split in Split:
                blend = c.blend_per_split[split.value]
                if blend is None:
                    out.append(None)
                    continue
                out.append(self._blend(blend, split, whole=True))
            return out
        return [self._blend(c.blend, split) for split in Split]

    def _blend(self, blend, split: Split, whole: bool = False):
        prefixes, weights = _weights_and_prefixes(blend)
        size = self.sizes[split.value]
        if not whole and self.config.split_matrix[split.value] is None:
            return None
        if weights is None or len(prefixes) == 1:
            if len(prefixes) == 1:
                return self._build_splits(prefixes[0], self.sizes, whole)[split.value]
            datasets = [self._build_splits(p, [None] * 3, whole)[split.value] for p in prefixes]
            weights = [len(d) for d in datasets]
            return BlendedDataset(datasets, weights, size if size is not None else sum(weights), self.config)
        total = float(sum(weights))
        if size is None:
            raise ValueError(f"{split.name}: a weighted blend needs a size (got None)")
        per = [math.ceil(w / total * size * (1 + self.config.mid_level_dataset_surplus)) for w in weights]
        datasets = [self._build_splits(p, [n if i == split.value else None for i in range(3)], whole)[split.value]
                    for p, n in zip(prefixes, per)]
        return BlendedDataset(datasets, weights, size, self.config)

    def _build_splits(self, prefix, sizes, whole: bool = False) -> list:
        """The ``cls`` datasets of one prefix for every split with documents."""
        low = self.cls.build_low_level_dataset(prefix, self.config)
        n = self.cls.numel_low_level_dataset(low)
        out = []
        for split in Split:
            bounds = (0.0, 1.0) if whole else self.config.split_matrix[split.value]
            begin, end = (round(bounds[0] * n), round(bounds[1] * n)) if bounds else (0, 0)
            if end <= begin:
                out.append(None)
                continue
            out.append(self.cls(low, prefix, numpy.arange(begin, end), sizes[split.value], split, self.config))
        return out
