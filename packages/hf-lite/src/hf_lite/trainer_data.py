"""The Trainer's data (transformers' ``Trainer.get_train_dataloader`` / ``get_eval_dataloader``): batches per rank, the
training order a function of (seed, epoch) so a resumed run sees the batches the uninterrupted one saw, evaluation
batches dealt to the ranks in turn. The ``Trainer`` (``trainer_loop.py``) takes these functions as its methods."""

from __future__ import annotations

import inspect
from functools import partial

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from .trainer_pt_utils import IterableDatasetShard, SkipBatchSampler
from .trainer_utils import seed_worker


def collate_fn(trainer):
    if not trainer.args.remove_unused_columns:
        return trainer.data_collator
    params = inspect.signature(trainer.parallelism.unwrap_model(trainer.model).forward).parameters
    keep, collator = set(params) | set(trainer.label_names) | {"label", "label_ids"}, trainer.data_collator

    def remove_columns_collator(features):  # transformers' RemoveColumnsCollator
        if features and isinstance(features[0], dict):
            features = [{k: v for k, v in f.items() if k in keep} for f in features]
        return collator(features)

    return remove_columns_collator


def loader_kwargs(trainer) -> dict:
    args = trainer.args
    kwargs = {"collate_fn": collate_fn(trainer), "num_workers": args.dataloader_num_workers,
              "pin_memory": args.dataloader_pin_memory and args.device.type == "cuda"}
    if args.dataloader_num_workers > 0:
        kwargs.update(persistent_workers=args.dataloader_persistent_workers,
                      prefetch_factor=args.dataloader_prefetch_factor)
    return kwargs


def get_train_dataloader(trainer) -> DataLoader:
    """Map-style data: a ``DistributedSampler`` shuffling with ``data_seed`` (or ``seed``) + epoch on every world
    size, which on one process is the order transformers' seeded sampler gives; iterable data: sharded by rank."""
    args, dataset = trainer.args, trainer.train_dataset
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    world, rank = trainer.parallelism.world_size, trainer.parallelism.process_index
    kwargs = loader_kwargs(trainer)
    if isinstance(dataset, IterableDataset):
        if world > 1:
            dataset = IterableDatasetShard(dataset, args.train_batch_size, args.dataloader_drop_last, world, rank)
        return DataLoader(dataset, batch_size=args.train_batch_size, **kwargs)
    seed = args.data_seed if args.data_seed is not None else args.seed
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    batches = SkipBatchSampler(sampler, args.train_batch_size, args.dataloader_drop_last)
    worker_init_fn = partial(seed_worker, num_workers=args.dataloader_num_workers, rank=rank)
    return DataLoader(dataset, batch_sampler=batches, worker_init_fn=worker_init_fn, **kwargs)


def get_eval_dataloader(trainer, eval_dataset=None) -> tuple[DataLoader, int]:
    """The rank's batches, and how many batches were repeated so every rank makes the same number of steps: each
    batch goes to one rank in turn (rank r takes batches r, r+N, ...), the last round completed with repeats of
    the first batches, which count no tokens and are dropped after gathering."""
    if eval_dataset is None and trainer.eval_dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset.")
    if isinstance(eval_dataset, str):
        eval_dataset = trainer.eval_dataset[eval_dataset]
    return eval_loader(trainer, eval_dataset if eval_dataset is not None else trainer.eval_dataset)


def eval_loader(trainer, dataset) -> tuple[DataLoader, int]:
    args, world, rank = trainer.args, trainer.parallelism.world_size, trainer.parallelism.process_index
    kwargs = loader_kwargs(trainer)
    if isinstance(dataset, IterableDataset):
        if world > 1:
            dataset = IterableDatasetShard(dataset, args.eval_batch_size, False, world, rank)
        return DataLoader(dataset, batch_size=args.eval_batch_size, **kwargs), 0
    indices = list(range(len(dataset)))
    batches = [indices[i : i + args.eval_batch_size] for i in range(0, len(indices), args.eval_batch_size)]
    if args.dataloader_drop_last and len(batches) > 1 and len(batches[-1]) < args.eval_batch_size:
        batches.pop()  # transformers drops the short last batch of evaluation loaders too
    padded = (-len(batches)) % world
    batches += [batches[i % len(batches)] for i in range(padded)]
    return DataLoader(dataset, batch_sampler=batches[rank::world], **kwargs), padded
