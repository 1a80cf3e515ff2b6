"""Loading a checkpoint into a built model (transformers' ``core_model_loading``).

1. Each checkpoint key is renamed to the model key it fills: as is, with ``base_model_prefix`` stripped (a head
   checkpoint into the base model) or added (a base checkpoint into a head model: tried first for such a file).
   Two keys landing on one model key are a collision: the prefixed one is the base model's weight, the bare one a
   head's, reported unexpected.
2. Every shape is checked against the model from the safetensors headers (or the mmapped ``pytorch_model.bin``),
   before any tensor is read.
3. Modules with missing weights are initialised, then the checkpoint is copied in shard by shard, converted to the
   parameters' dtype on the way (the model was built uninitialised, in that dtype).
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn
from tqdm.auto import tqdm

from .checkpoint_bin import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, load_bin_file, resolve_bin_files
from .checkpoint_utils import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    CheckpointError,
    add_variant,
    load_safetensors_file,
    read_safetensors_header,
    resolve_weight_files,
)

logger = logging.getLogger(__name__)

_SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def weight_file_names(variant: str | None = None, use_safetensors: bool | None = None) -> list[str]:
    """The weight files a checkpoint may have, in the order ``resolve_checkpoint_files`` prefers them."""
    safe = [add_variant(SAFE_WEIGHTS_NAME, variant), add_variant(SAFE_WEIGHTS_INDEX_NAME, variant)]
    pickled = [add_variant(WEIGHTS_NAME, variant), add_variant(WEIGHTS_INDEX_NAME, variant)]
    return pickled if use_safetensors is False else safe if use_safetensors else safe + pickled


def resolve_checkpoint_files(directory: str, variant: str | None = None, use_safetensors: bool | None = None):
    """``{file: keys}``: safetensors first; ``pytorch_model.bin`` (shards) when there are none or
    ``use_safetensors=False``, as transformers chooses."""
    if use_safetensors is False:
        found = resolve_bin_files(directory, variant)
        if found is None:
            raise CheckpointError(f"use_safetensors=False but {directory!r} has no pytorch_model.bin (or index)")
        return found
    try:
        return resolve_weight_files(directory, variant)
    except CheckpointError:
        found = None if use_safetensors else resolve_bin_files(directory, variant)
        if found is None:
            raise
        return found


def _is_bin(file: str) -> bool:
    return file.endswith(".bin")


def weight_shapes(file: str) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Each tensor's shape and dtype, from the safetensors header (no data read) or the mmapped ``.bin``."""
    if _is_bin(file):
        return {k: (tuple(v.shape), v.dtype) for k, v in load_bin_file(file).items()}
    header = read_safetensors_header(file)
    return {k: (tuple(v["shape"]), _SAFETENSORS_FLOATS.get(v["dtype"])) for k, v in header.items()}


def load_weights(file: str, keys: list[str]) -> dict[str, torch.Tensor]:
    if not _is_bin(file):
        return load_safetensors_file(file, keys)
    state_dict = load_bin_file(file)
    missing = [k for k in keys if k not in state_dict]
    if missing:
        raise CheckpointError(f"{file} does not contain tensor {missing[0]!r} although the index says it does")
    return {k: state_dict[k] for k in keys}


def checkpoint_float_dtype(files: dict[str, list[str]]) -> torch.dtype | None:
    """The dtype of the first floating tensor of the first weight file (``dtype="auto"`` without a config dtype)."""
    file, keys = next(iter(files.items()))
    shapes = weight_shapes(file)
    for key in keys:
        dtype = shapes.get(key, ((), None))[1]
        if dtype is not None and dtype.is_floating_point:
            return dtype
    return None


def rename_checkpoint_keys(checkpoint_keys: list[str], model_keys: set[str],
                           prefix: str) -> tuple[dict[str, str], list[str]]:
    """``{checkpoint key: model key}`` for the keys that load, and the checkpoint keys that do not.

    A checkpoint without one ``prefix.`` key loaded into a model that has the base model under ``prefix`` is a
    base-model checkpoint: each key goes into the base model first (a head module may share a name with a base
    module, e.g. ``linear``). Otherwise a key loads as is, else with ``prefix.`` stripped, else added."""
    dot = f"{prefix}." if prefix else None
    base_into_head = (dot is not None and not any(k.startswith(dot) for k in checkpoint_keys)
                      and any(k.startswith(dot) for k in model_keys))
    claimed: dict[str, str] = {}
    unexpected = []
    for key in checkpoint_keys:
        if base_into_head and dot + key in model_keys:
            target = dot + key
        elif key in model_keys:
            target = key
        elif dot and key.startswith(dot) and key[len(dot) :] in model_keys:
            target = key[len(dot) :]
        elif dot and dot + key in model_keys:
            target = dot + key
        else:
            unexpected.append(key)
            continue
        other = claimed.get(target)
        if other is None:
            claimed[target] = key
            continue
        keep, drop = (key, other) if dot and key.startswith(dot) else (other, key)
        logger.warning("Checkpoint keys %r and %r both load into %r; keeping %r", other, key, target, keep)
        claimed[target] = keep
        unexpected.append(drop)
    return {ckpt: target for target, ckpt in claimed.items()}, unexpected


def _alias_groups(params: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Key -> every key naming the same tensor (tied weights), in state_dict order."""
    by_tensor: dict[int, list[str]] = {}
    for key, tensor in params.items():
        by_tensor.setdefault(id(tensor), []).append(key)
    return {key: names for names in by_tensor.values() for key in names}


def load_checkpoint(model: nn.Module, files: dict[str, list[str]], ignore_mismatched_sizes: bool) -> dict:
    """Fill ``model`` from the weight files; returns transformers' loading-info dict (nothing is copied on error)."""
    params = dict(model.state_dict(keep_vars=True))
    all_keys = [k for keys in files.values() for k in keys]
    to_model, unexpected = rename_checkpoint_keys(all_keys, set(params), model.base_model_prefix)
    aliases = _alias_groups(params)
    targets = set(model._tied_weights_keys) if getattr(model.config, "tie_word_embeddings", False) else set()
    # A tied pair present twice in the checkpoint loads once, from its source (as transformers re-ties to it).
    chosen: dict[str, str] = {}
    for ckpt_key, key in to_model.items():
        group = aliases[key][0]
        if group not in chosen or (to_model[chosen[group]] in targets and key not in targets):
            chosen[group] = ckpt_key
    plan: dict[str, list[tuple[str, str]]] = {}
    mismatched, loaded = [], set()
    for file, keys in files.items():
        shapes = weight_shapes(file)
        for ckpt_key in keys:
            key = to_model.get(ckpt_key)
            if key is None or chosen[aliases[key][0]] != ckpt_key:
                continue
            if ckpt_key not in shapes:
                raise CheckpointError(f"{file} does not contain tensor {ckpt_key!r} although the index says it does")
            shape, want = shapes[ckpt_key][0], tuple(params[key].shape)
            if shape != want:
                if not ignore_mismatched_sizes:
                    raise CheckpointError(
                        f"{file}: tensor {ckpt_key!r} has shape {shape} but {type(model).__name__} expects {want} "
                        f"for {key!r} (does config.json match the weights?). Pass ignore_mismatched_sizes=True to "
                        "re-initialise such weights instead."
                    )
                mismatched.append((key, shape, want))
                continue
            plan.setdefault(file, []).append((ckpt_key, key))
            loaded.add(key)
    not_loaded = [k for k in params if not any(a in loaded for a in aliases[k])]
    ignore = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", [])]
    unexpected = [k for k in unexpected if not any(p.search(k) for p in ignore)]

    _initialise(model, not_loaded)
    shards = tqdm(plan.items(), desc="Loading checkpoint shards", disable=len(plan) <= 1, leave=False)
    with torch.no_grad():
        for file, pairs in shards:
            tensors = load_weights(file, [ckpt_key for ckpt_key, _ in pairs])
            for ckpt_key, key in pairs:
                params[key].copy_(tensors.pop(ckpt_key))
    skipped = {m[0] for m in mismatched}
    return {"missing_keys": [k for k in not_loaded if k not in skipped], "unexpected_keys": unexpected,
            "mismatched_keys": mismatched, "error_msgs": []}


def _initialise(model: nn.Module, keys: list[str]) -> None:
    """Run ``_init_weights`` on the modules owning ``keys``: built uninitialised, nothing will overwrite them.
    Loaded weights of the same modules are copied in afterwards."""
    owners = {key.rsplit(".", 1)[0] if "." in key else "" for key in keys}
    with torch.no_grad():
        for name in sorted(owners):
            model._init_weights(model.get_submodule(name))


def log_loading_info(model: nn.Module, path: str, info: dict) -> None:
    name = type(model).__name__
    if info["unexpected_keys"]:
        logger.warning("Some weights of the model checkpoint at %s were not used when initializing %s: %s", path, name,
                       info["unexpected_keys"])
    if info["missing_keys"]:
        logger.warning("Some weights of %s were not initialized from the model checkpoint at %s and are newly "
                       "initialized: %s\nYou should probably TRAIN this model on a down-stream task.", name, path,
                       info["missing_keys"])
    if info["mismatched_keys"]:
        detail = ", ".join(f"{k}: checkpoint {a} vs model {b}" for k, a, b in info["mismatched_keys"])
        logger.warning("Some weights of %s were re-initialized because of shape mismatches: %s", name, detail)
