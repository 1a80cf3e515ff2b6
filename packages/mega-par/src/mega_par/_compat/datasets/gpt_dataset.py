"""``GPTDataset`` / ``MockGPTDataset``: fixed-length samples cut across documents of a low-level dataset
(``megatron/core/datasets/gpt_dataset.py``).

The indices are upstream's: a document index (every exposed document once per epoch, shuffled with
``numpy.random.RandomState(random_seed)``), a sample index (each sample's first document and offset, upstream's
C++ ``build_sample_idx``, here vectorised with numpy: sample ``j`` starts at token ``j * sequence_length`` of
the concatenated documents and reads ``sequence_length + 1`` tokens), and a shuffle index over the samples.
Upstream caches them as ``.npy`` files and separates a small final epoch; mega_par builds them in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy
import torch

from mega_par._compat.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig, Split
from mega_par._compat.datasets.indexed_dataset import IndexedDataset


@dataclass
class GPTDatasetConfig(BlendedMegatronDatasetConfig):
    """Upstream's GPT fields."""

    reset_position_ids: bool | None = None
    reset_attention_mask: bool | None = None
    eod_mask_loss: bool | None = None
    create_attention_mask: bool = True
    drop_last_partial_validation_sequence: bool = True
    add_extra_token_to_sequence: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer is None:
            raise ValueError("GPTDatasetConfig needs a tokenizer (its eod id marks document ends)")
        for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss"):
            if getattr(self, name) is None:
                raise ValueError(f"GPTDatasetConfig.{name} must be set (True or False), as upstream asserts")


def _get_ltor_masks_and_position_ids(data, eod_token, reset_position_ids, reset_attention_mask, eod_mask_loss,
                                     create_attention_mask):
    """Causal ``attention_mask [1, s, s]`` (True = masked out), ``loss_mask``, ``position_ids``; with the resets,
    documents after an eod do not see the earlier ones and restart their positions (upstream's function)."""
    s = data.numel()
    attention_mask = torch.tril(torch.ones(s, s)).unsqueeze(0) if create_attention_mask else None
    loss_mask = torch.ones(s, dtype=torch.float)
    if eod_mask_loss:
        loss_mask[data == eod_token] = 0.0
    position_ids = torch.arange(s, dtype=torch.long)
    if reset_position_ids or reset_attention_mask:
        prev = 0
        for i in position_ids[data == eod_token].tolist():
            if reset_attention_mask and attention_mask is not None:
                attention_mask[0, i + 1:, : i + 1] = 0
            if reset_position_ids:
                position_ids[i + 1:] -= i + 1 - prev
                prev = i + 1
    if attention_mask is not None:
        attention_mask = attention_mask < 0.5
    return attention_mask, loss_mask, position_ids


class GPTDataset(torch.utils.data.Dataset):
    """Upstream's constructor: ``(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split,
    config)``; ``num_samples=None`` means one epoch. Items are upstream's dict of tensors."""

    def __init__(self, indexed_dataset, dataset_path, indexed_indices, num_samples, index_split: Split,
                 config: GPTDatasetConfig) -> None:
        self.dataset, self.dataset_path, self.indices = indexed_dataset, dataset_path, numpy.asarray(indexed_indices)
        self.num_samples, self.index_split, self.config = num_samples, index_split, config
        if len(self.indices) == 0:
            raise ValueError(f"GPTDataset {dataset_path!r} ({index_split.name}): no documents in this split")
        self._pad_token_id = getattr(config.tokenizer, "pad", -1)
        self.document_index, self.sample_index, self.shuffle_index = self._build_document_sample_shuffle_indices()

    @staticmethod
    def numel_low_level_dataset(low_level_dataset) -> int:
        return len(low_level_dataset.sequence_lengths)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        return IndexedDataset(dataset_path, mmap=config.mmap_bin_files)

    def _build_document_sample_shuffle_indices(self):
        seq, extra = self.config.sequence_length, int(self.config.add_extra_token_to_sequence)
        sizes = numpy.asarray(self.dataset.sequence_lengths, dtype=numpy.int64)
        tokens_per_epoch = int(sizes[self.indices].sum())
        num_epochs = 1
        if self.num_samples is not None:
            while (num_epochs * tokens_per_epoch - extra) // seq < self.num_samples:
                num_epochs += 1
        rng = numpy.random.RandomState(self.config.random_seed)
        document_index = numpy.tile(self.indices, num_epochs).astype(numpy.int32)
        rng.shuffle(document_index)
        n = (num_epochs * tokens_per_epoch - extra) // seq
        if n < 1:
            raise ValueError(f"GPTDataset {self.dataset_path!r}: {tokens_per_epoch} tokens cannot fill one sample "
                             f"of {seq} + {extra} tokens")
        ends = numpy.cumsum(sizes[document_index])
        starts = numpy.arange(n + 1, dtype=numpy.int64) * seq
        doc = numpy.searchsorted(ends, starts, side="right")
        offset = starts - numpy.where(doc > 0, ends[numpy.maximum(doc - 1, 0)], 0)
        sample_index = numpy.stack([doc, offset], axis=1)
        shuffle_index = numpy.arange(n, dtype=numpy.int64)
        rng.shuffle(shuffle_index)
        return document_index, sample_index, shuffle_index

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    def _query_document_sample_shuffle_indices(self, idx: int) -> numpy.ndarray:
        idx = self.shuffle_index[idx]
        (beg, beg_off), (end, end_off) = self.sample_index[idx], self.sample_index[idx + 1]
        extra = int(self.config.add_extra_token_to_sequence)
        parts = []
        for i in range(beg, end + 1):
            offset = beg_off if i == beg else 0
            length = end_off + extra - offset if i == end else None
            parts.append(self.dataset.get(int(self.document_index[i]), offset=int(offset), length=length))
        return numpy.concatenate(parts).astype(numpy.int64)

    def __getitem__(self, idx: int) -> dict:
        text = torch.from_numpy(self._query_document_sample_shuffle_indices(idx))
        if self.config.add_extra_token_to_sequence:
            tokens, labels = text[:-1].contiguous(), text[1:].contiguous()
        else:
            tokens, labels = text, torch.roll(text, shifts=-1, dims=0)
            labels[-1] = self._pad_token_id
        attention_mask, loss_mask, position_ids = _get_ltor_masks_and_position_ids(
            tokens, self.config.tokenizer.eod, self.config.reset_position_ids, self.config.reset_attention_mask,
            self.config.eod_mask_loss, self.config.create_attention_mask)
        loss_mask[labels == self._pad_token_id] = 0.0
        out = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
        if attention_mask is not None:
            out["attention_mask"] = attention_mask
        return out


class MockGPTLowLevelDataset:
    """Upstream's mock documents: 100000 of random length in [1, 4096) (``default_rng(0)``), document ``i`` is
    ``1, 2, ..., length - 1`` (mod vocab) then eod."""

    seed: int = 0
    size: int = 100000
    max_sequence_length: int = 4096

    def __init__(self, tokenizer) -> None:
        self.vocab_size, self.eod_token = tokenizer.vocab_size, tokenizer.eod
        rng = numpy.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(low=1, high=self.max_sequence_length, size=self.size, dtype=numpy.int32)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> numpy.ndarray:
        length = self.sequence_lengths[idx]
        return numpy.int64(numpy.concatenate([(numpy.arange(length - 1) + 1) % self.vocab_size, [self.eod_token]]))

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> numpy.ndarray:
        if length is None:
            length = self.sequence_lengths[idx] - offset
        return self[idx][offset:offset + length]


class MockGPTDataset(GPTDataset):
    """``GPTDataset`` over ``MockGPTLowLevelDataset`` (``config.mock`` must be True: no blend given)."""

    def __init__(self, dataset, dataset_path, indices, num_samples, index_split, config) -> None:
        if not config.mock:
            raise ValueError("MockGPTDataset needs config.mock (a config without blend / blend_per_split)")
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path, config) -> MockGPTLowLevelDataset:
        return MockGPTLowLevelDataset(config.tokenizer)
