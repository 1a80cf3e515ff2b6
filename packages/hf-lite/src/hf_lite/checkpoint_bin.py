"""``pytorch_model.bin`` checkpoints (transformers' ``WEIGHTS_NAME`` path): pickled state dicts written with
``torch.save`` and read with ``torch.load(weights_only=True)``, one file or shards with
``pytorch_model.bin.index.json``, the layout ``save_pretrained(safe_serialization=False)`` writes."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import zipfile

import torch

from ._infra.atomic_io import atomic_write_bytes, atomic_write_text
from .checkpoint_utils import CheckpointError, read_weight_index, split_state_dict_into_shards

WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


def bin_name(name: str, variant: str | None) -> str:
    """``pytorch_model.bin`` -> ``pytorch_model.fp16.bin`` (the index: ``pytorch_model.bin.index.fp16.json``)."""
    if variant is None:
        return name
    stem, ext = name.rsplit(".", 1)
    return f"{stem}.{variant}.{ext}"


def is_bin_weight_file(name: str, variant: str | None) -> bool:
    """A file a ``.bin`` save of this ``variant`` writes: its single file, a shard or its index."""
    single = bin_name(WEIGHTS_NAME, variant)
    stem = re.escape(single[: -len(".bin")])
    return name in (single, bin_name(WEIGHTS_INDEX_NAME, variant)) or re.match(
        rf"^{stem}-\d{{5}}-of-\d{{5}}\.bin$", name
    ) is not None


def save_bin_state_dict(state_dict: dict[str, torch.Tensor], directory: str, max_shard_size, variant=None) -> None:
    """One ``torch.save`` per shard (named as transformers names them), plus the index when there are several."""
    tensors = {k: v.detach().contiguous() for k, v in state_dict.items()}
    shards = split_state_dict_into_shards(tensors, max_shard_size)
    single = bin_name(WEIGHTS_NAME, variant)
    stem = single[: -len(".bin")]
    count = len(shards)
    names = [single] if count == 1 else [f"{stem}-{i + 1:05d}-of-{count:05d}.bin" for i in range(count)]
    weight_map = {}
    for name, keys in zip(names, shards):
        buffer = io.BytesIO()
        torch.save({k: tensors[k].clone() for k in keys}, buffer)  # a clone saves the tensor, not its whole storage
        atomic_write_bytes(os.path.join(directory, name), buffer.getvalue())
        weight_map.update({k: name for k in keys})
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        index_path = os.path.join(directory, bin_name(WEIGHTS_INDEX_NAME, variant))
        atomic_write_text(index_path, json.dumps(index, indent=2) + "\n")


def load_bin_file(file: str) -> dict[str, torch.Tensor]:
    """The state dict of one ``.bin`` file; only tensors and plain containers are unpickled (``weights_only``)."""
    try:
        state_dict = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{file} is not a readable pytorch_model.bin state dict: {err}") from err
    if not isinstance(state_dict, dict) or not all(torch.is_tensor(v) for v in state_dict.values()):
        raise CheckpointError(f"{file} does not hold a state dict of tensors")
    return state_dict


def resolve_bin_files(directory: str, variant: str | None) -> dict[str, list[str]] | None:
    """``{file: keys}`` of a ``.bin`` checkpoint in ``directory``, or None when it has none."""
    index_path = os.path.join(directory, bin_name(WEIGHTS_INDEX_NAME, variant))
    single = os.path.join(directory, bin_name(WEIGHTS_NAME, variant))
    if os.path.isfile(index_path):
        return read_weight_index(directory, index_path)
    if os.path.isfile(single):
        return {single: list(load_bin_file(single))}
    return None
