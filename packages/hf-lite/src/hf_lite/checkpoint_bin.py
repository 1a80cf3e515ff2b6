"""``pytorch_model.bin`` checkpoints (transformers' ``WEIGHTS_NAME`` path): pickled state dicts written with
``torch.save`` and read with ``torch.load(weights_only=True)``, one file or shards with
``pytorch_model.bin.index.json``, the layout ``save_pretrained(safe_serialization=False)`` writes."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import torch

from ._infra.atomic_io import atomic_write_bytes
from .checkpoint_utils import CheckpointError, add_variant, is_weight_file, read_weight_index, write_shards

WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


def is_bin_weight_file(name: str, variant: str | None) -> bool:
    """A file a ``.bin`` save of this ``variant`` writes: its single file, a shard or its index."""
    return is_weight_file(name, variant, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


def _atomic_torch_save(part: dict[str, torch.Tensor], path: str) -> None:
    buffer = io.BytesIO()
    torch.save(part, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def save_bin_state_dict(state_dict: dict[str, torch.Tensor], directory: str, max_shard_size, variant=None,
                        save_function=torch.save) -> None:
    """One ``save_function(shard, path)`` per shard (named as transformers names them), plus the index when there
    are several; ``torch.save`` itself writes each file whole (atomically)."""
    tensors = {k: v.detach().contiguous() for k, v in state_dict.items()}
    single, index = add_variant(WEIGHTS_NAME, variant), add_variant(WEIGHTS_INDEX_NAME, variant)
    save = _atomic_torch_save if save_function is torch.save else save_function
    # a clone saves the tensor, not its whole storage
    write_shards(tensors, max_shard_size, directory, single, index, lambda part, path: save(
        {k: v.clone() for k, v in part.items()}, path))


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
    index_path = os.path.join(directory, add_variant(WEIGHTS_INDEX_NAME, variant))
    single = os.path.join(directory, add_variant(WEIGHTS_NAME, variant))
    if os.path.isfile(index_path):
        return read_weight_index(directory, index_path)
    if os.path.isfile(single):
        return {single: list(load_bin_file(single))}
    return None
