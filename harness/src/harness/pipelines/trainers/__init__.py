"""The training paths of ``train-then-serve``: each trains on the ranks it is given and leaves a Hugging Face
checkpoint directory (config.json + model.safetensors) written by its own package's converter.

Every trainer module has ``check(spec)`` (raises before any process starts: ``NotBuiltError`` when its package part
does not exist yet, ``ValueError`` for bad options) and ``train(rank, world_size, spec) -> dict`` (run on every
rank; rank 0's result carries the loss curve).
"""

from __future__ import annotations

import importlib


class NotBuiltError(RuntimeError):
    """The package part this trainer needs is not built yet."""


TRAINERS = {
    "hf-lite": "harness.pipelines.trainers.hf_lite",
    "ds-zero": "harness.pipelines.trainers.ds_zero",
    "mega-par": "harness.pipelines.trainers.mega_par",
    "pt-dist-ddp": "harness.pipelines.trainers.pt_dist",
    "pt-dist-fsdp": "harness.pipelines.trainers.pt_dist",
}


def get_trainer(name: str):
    if name not in TRAINERS:
        raise ValueError(f"unknown trainer {name!r}; choose one of {sorted(TRAINERS)}")
    return importlib.import_module(TRAINERS[name])
