"""``initialize(training_data=...)``: the data loader DeepSpeed's engine builds (``deepspeed_io``), and
``RepeatingLoader``, a loader that starts over when it runs out (``deepspeed/runtime/dataloader.py``, also
``deepspeed.utils.RepeatingLoader``)."""

from __future__ import annotations

import torch


class RepeatingLoader:
    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)

    def __len__(self):
        return len(self.loader)


def build_dataloader(engine, data, collate_fn=None, pipeline: bool = False):
    """This data-parallel rank's share of ``data`` in micro-batches. For the pipeline engine (its
    ``_build_data_iter``) in order, without shuffling, repeated without end, so ``train_batch()`` never runs out."""
    if data is None:
        return None
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=engine.dp_world_size, rank=engine.groups.dp_rank,
                                                  shuffle=not pipeline)
    loader = torch.utils.data.DataLoader(data, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler,
                                         collate_fn=collate_fn, drop_last=engine.dataloader_drop_last())
    return RepeatingLoader(loader) if pipeline else loader
