"""Torch helpers of the Trainer (transformers' ``trainer_pt_utils.py`` and the bits of accelerate it relies on):
sharding iterable data by rank, skipping batches on resume, concatenating predictions of different lengths."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch.utils.data import BatchSampler, IterableDataset

from .optimization import get_parameter_names  # noqa: F401  (transformers keeps it here; scripts import it)


def nested_map(fn, tensors):
    """``fn`` on every tensor of nested lists, tuples and dicts; the containers keep their types."""
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_map(fn, t) for t in tensors)
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_map(fn, v) for k, v in tensors.items()})
    return fn(tensors) if torch.is_tensor(tensors) else tensors


def find_batch_size(tensors) -> int | None:
    """The first dimension of the first tensor with one, depth first."""
    if isinstance(tensors, Mapping):
        tensors = list(tensors.values())
    if isinstance(tensors, (list, tuple)):
        return next((found for t in tensors if (found := find_batch_size(t)) is not None), None)
    return tensors.shape[0] if torch.is_tensor(tensors) and tensors.dim() >= 1 else None


def nested_detach(tensors):
    return nested_map(torch.Tensor.detach, tensors)


def nested_cpu(tensors):
    return nested_map(torch.Tensor.cpu, tensors)


def nested_numpify(tensors):
    """Tensors -> numpy arrays (bfloat16, which numpy lacks, as float32), as transformers' ``nested_numpify``."""

    def numpify(t):
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    return nested_map(numpify, tensors)


def torch_pad_and_concatenate(a: torch.Tensor, b: torch.Tensor, padding_index: int = -100) -> torch.Tensor:
    """Concatenate on dim 0; rows of a different second dimension are right-padded with ``padding_index``."""
    if a.dim() == 1 or a.shape[1:] == b.shape[1:]:
        return torch.cat((a, b), dim=0)
    shape = (a.shape[0] + b.shape[0], max(a.shape[1], b.shape[1])) + tuple(a.shape[2:])
    result = a.new_full(shape, padding_index)
    result[: a.shape[0], : a.shape[1]] = a
    result[a.shape[0] :, : b.shape[1]] = b
    return result


def nested_concat(tensors, new_tensors, padding_index: int = -100):
    if tensors is None:
        return new_tensors
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_concat(t, n, padding_index) for t, n in zip(tensors, new_tensors))
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_concat(t, new_tensors[k], padding_index) for k, t in tensors.items()})
    return torch_pad_and_concatenate(tensors, new_tensors, padding_index)


class SkipBatchSampler(BatchSampler):
    """Batches of ``sampler`` as ``BatchSampler`` makes them; the next iteration first skips ``skip_batches`` of
    them (without loading their data), which is how a resumed run lands on the batch it stopped at."""

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        super().__init__(sampler, batch_size, drop_last)
        self.skip_batches = 0

    def __iter__(self):
        skip, self.skip_batches = self.skip_batches, 0
        for i, batch in enumerate(super().__iter__()):
            if i >= skip:
                yield batch

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


class IterableDatasetShard(IterableDataset):
    """Rank ``process_index``'s share of an iterable dataset: of each ``batch_size * num_processes`` consecutive
    examples it yields its own ``batch_size``. A short last round is completed from the first examples unless
    ``drop_last`` (as transformers' ``IterableDatasetShard``), so every rank makes the same number of steps."""

    def __init__(self, dataset, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_processes, self.process_index = num_processes, process_index
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator:
        real = self.batch_size * self.num_processes
        lo, hi = self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size
        first, buffer = None, []
        for example in self.dataset:
            buffer.append(example)
            if len(buffer) == real:
                yield from buffer[lo:hi]
                first = first if first is not None else list(buffer)
                buffer = []
        if buffer and not self.drop_last:
            first = first if first is not None else list(buffer)
            while len(buffer) < real:
                buffer += first[: real - len(buffer)]
            yield from buffer[lo:hi]
