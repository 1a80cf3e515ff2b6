"""``RepeatingLoader``: a data loader that starts over when it runs out (DeepSpeed's
``deepspeed/runtime/dataloader.py``, also ``deepspeed.utils.RepeatingLoader``); the pipeline engine wraps the
loader it builds from ``training_data`` in one, so ``train_batch()`` never runs out of data."""

from __future__ import annotations


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
