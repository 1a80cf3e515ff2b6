"""Safetensors checkpoint files: sharded writing with an index, and validated reading.

Mirrors transformers' ``save_pretrained(max_shard_size=...)`` layout (``model.safetensors`` or
``model-0000X-of-0000N.safetensors`` + ``model.safetensors.index.json``). Reading validates each file's header against
its size before any tensor is copied (``_infra/safetensors_header.py``), so a truncated or corrupted file fails with
the file and tensor named.
"""

from __future__ import annotations

import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save

from ._infra.atomic_io import atomic_write_bytes, atomic_write_text
from ._infra.hub import shard_state_dict
from ._infra.safetensors_header import CheckpointError, read_safetensors_header

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def add_variant(name: str, variant: str | None) -> str:
    """``model.safetensors`` -> ``model.fp16.safetensors``, ``...index.json`` -> ``...index.fp16.json``."""
    if variant is None:
        return name
    if not isinstance(variant, str) or not variant or any(c in variant for c in "/\\"):
        raise ValueError(f"variant={variant!r} must be a non-empty name such as 'fp16'")
    stem, ext = name.rsplit(".", 1)
    return f"{stem}.{variant}.{ext}"


def is_weight_file(name: str, variant: str | None, single: str = SAFE_WEIGHTS_NAME,
                   index: str = SAFE_WEIGHTS_INDEX_NAME) -> bool:
    """A file a save of this ``variant`` writes (or leaves stale): its single file, a shard, or its index."""
    single, index = add_variant(single, variant), add_variant(index, variant)
    stem, ext = single.rsplit(".", 1)
    return name in (single, index) or re.match(rf"^{re.escape(stem)}-\d{{5}}-of-\d{{5}}\.{ext}$", name) is not None


def convert_file_size_to_int(size: int | str) -> int:
    """``"5GB"`` -> 5 * 10**9, ``"5GiB"`` -> 5 * 2**30, ints pass through (transformers' convention)."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)\s*", str(size), flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"max_shard_size={size!r} is not an int or a size like '5GB', '200MB', '1GiB'")
    number, unit = float(match.group(1)), match.group(2).upper()
    power = "BKMGT".index(unit[0]) if unit != "B" else 0
    base = 1024 if "I" in unit else 1000
    value = int(number * base**power)
    if value <= 0:
        raise ValueError(f"max_shard_size={size!r} must be positive")
    return value


def save_state_dict(state_dict: dict[str, torch.Tensor], save_directory: str, max_shard_size: int | str = "50GB",
                    metadata=None, variant: str | None = None, index_metadata=None) -> list[str]:
    """Write ``state_dict`` into ``save_directory`` as one file, or shards + index (transformers' layout)."""
    metadata = {"format": "pt", **(metadata or {})}
    tensors, storages = {}, set()
    for key, value in state_dict.items():
        tensor = value.detach().contiguous()
        # safetensors refuses tensors sharing memory (views of one buffer): each gets its own copy.
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        tensors[key] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    single, index = add_variant(SAFE_WEIGHTS_NAME, variant), add_variant(SAFE_WEIGHTS_INDEX_NAME, variant)
    write = lambda part, path: atomic_write_bytes(path, safetensors_save(part, metadata=metadata))
    return write_shards(tensors, max_shard_size, save_directory, single, index, write, index_metadata)


def write_shards(tensors: dict[str, torch.Tensor], max_shard_size, directory: str, single: str, index_name: str,
                 write, index_metadata=None) -> list[str]:
    """``single``, or ``stem-0000i-of-0000n.ext`` shards split as huggingface_hub splits them for transformers
    (``_infra/hub.py``), each written by ``write(tensors, path)``, and the ``index_name`` weight map."""
    stem, ext = single.rsplit(".", 1)
    files, metadata = shard_state_dict(tensors, convert_file_size_to_int(max_shard_size), f"{stem}{{suffix}}.{ext}")
    for name, keys in files.items():
        write({k: tensors[k] for k in keys}, os.path.join(directory, name))
    if len(files) > 1:
        weight_map = {key: name for name, keys in files.items() for key in keys}
        index = {"metadata": {**(index_metadata or {}), **metadata}, "weight_map": weight_map}
        atomic_write_text(os.path.join(directory, index_name), json.dumps(index, indent=2, sort_keys=True) + "\n")
    return list(files)


def read_weight_index(directory: str, index_path: str) -> dict[str, list[str]]:
    """``{file: keys}`` from a sharded checkpoint's ``weight_map`` index, every listed file checked to exist."""
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as err:
        raise CheckpointError(f"{index_path} is not a valid weight index: {err!r}") from err
    files: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        files.setdefault(os.path.join(directory, name), []).append(key)
    for file, keys in files.items():
        if not os.path.isfile(file):
            raise CheckpointError(f"{file} is listed in {index_path} (e.g. for tensor {keys[0]!r}) but is missing")
    return files


def resolve_weight_files(directory: str, variant: str | None = None) -> dict[str, list[str]]:
    """Map each weight file of a checkpoint directory to the keys the index promises it holds."""
    directory = os.fspath(directory)
    index_path = os.path.join(directory, add_variant(SAFE_WEIGHTS_INDEX_NAME, variant))
    single = os.path.join(directory, add_variant(SAFE_WEIGHTS_NAME, variant))
    if os.path.isfile(index_path):
        return read_weight_index(directory, index_path)
    if os.path.isfile(single):
        return {single: list(read_safetensors_header(single))}
    names = f"{os.path.basename(single)} or {os.path.basename(index_path)}"
    others = sorted(e for e in os.listdir(directory) if e.endswith(".safetensors")) if os.path.isdir(directory) else []
    hint = f"; it has {others} (pass the matching variant=)" if others else " (hf-lite reads safetensors only)"
    raise CheckpointError(f"no {names} in {directory!r}{hint}")


def load_safetensors_file(file: str, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Load (some) tensors of one validated file; any low-level failure names the file and tensor."""
    header = read_safetensors_header(file)
    wanted = list(header) if keys is None else keys
    out = {}
    with safe_open(file, framework="pt") as f:
        for key in wanted:
            if key not in header:
                raise CheckpointError(f"{file} does not contain tensor {key!r} although the index says it does")
            try:
                out[key] = f.get_tensor(key)
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"{file}: cannot read tensor {key!r}: {err}") from err
    return out
