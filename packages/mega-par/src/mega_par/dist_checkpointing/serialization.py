"""``save`` / ``load`` of a sharded state dict, loadable into another TP/PP layout
(``megatron/core/dist_checkpointing/serialization.py``; our own file format, not torch DCP).

Layout of ``checkpoint_dir``::

    __<rank>_0.pt     each rank's main-replica shards: {"<key>@<global offset>": tensor (stored_shape)}
    common.pt         rank 0's entries that are not ShardedTensors (plain values, torch.save)
    metadata.json     written last: backend, per key its global shape, dtype and shards (file, offset,
                      shape), per file its size and sha256

Saving is committed by ``metadata.json``: rank 0 removes an old one before any shard is written, every file
is written under a temporary name and renamed, and the new ``metadata.json`` appears only after every rank's
shards are in place, so a half-written checkpoint has no metadata and is never loaded. Loading assembles each
requested shard from the overlapping saved ones; a file that is missing, truncated or altered (sha256) raises
``CheckpointingException`` naming it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import torch
import torch.distributed as dist

from mega_par._infra.atomic_io import atomic_write, atomic_write_text
from mega_par.dist_checkpointing.core import CheckpointingException
from mega_par.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory, is_main_replica

METADATA = "metadata.json"
COMMON = "common.pt"
BACKEND = "mega_par_torch"


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if _rank_world()[1] > 1:
        dist.barrier()


def _all_gather(obj) -> list:
    if _rank_world()[1] == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _expand_factories(sharded_state_dict: dict) -> dict:
    """Dict key -> ShardedTensor or plain value, factories replaced by what they build (keys ``key/sub``)."""
    flat = {}
    for name, value in sharded_state_dict.items():
        if isinstance(value, ShardedTensorFactory):
            for sub, sh in value.build().items():
                flat[f"{name}/{sub}"] = sh
        else:
            flat[name] = value
    return flat


def _check_exact_cover(key: str, entry: dict) -> None:
    """The main replicas tile the global tensor: pairwise disjoint, and their sizes add up to it."""
    shards = entry["shards"]
    for i, a in enumerate(shards):
        for b in shards[i + 1:]:
            if all(max(x, y) < min(x + n, y + m) for x, n, y, m in
                   zip(a["global_offset"], a["shape"], b["global_offset"], b["shape"])):
                raise CheckpointingException(f"{key}: shards at offsets {a['global_offset']} and "
                                             f"{b['global_offset']} overlap (two main replicas: check replica_id)")
    covered = sum(math.prod(s["shape"]) for s in shards)
    if covered != math.prod(entry["global_shape"]):
        raise CheckpointingException(f"{key}: main replicas cover {covered} of {math.prod(entry['global_shape'])} "
                                     "elements (a shard no rank saves as main replica)")


def save(sharded_state_dict: dict, checkpoint_dir: str, sharded_strategy=None, validate_access_integrity: bool = True,
         async_sharded_save: bool = False, preprocess_common_before_consistancy_check=None,
         content_metadata: dict | None = None) -> None:
    """Collective: every rank writes its main-replica shards; rank 0 writes the common state and, last,
    ``metadata.json``. Upstream's signature; only the synchronous, default-strategy save exists."""
    if sharded_strategy is not None or async_sharded_save:
        raise CheckpointingException(f"save: sharded_strategy={sharded_strategy!r} / async_sharded_save="
                                     f"{async_sharded_save} are not supported (one synchronous backend)")
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointingException(f"Checkpoint destination directory does not exist: {checkpoint_dir}")
    rank, _ = _rank_world()
    if rank == 0 and os.path.exists(os.path.join(checkpoint_dir, METADATA)):
        os.remove(os.path.join(checkpoint_dir, METADATA))  # an interrupted overwrite must not look complete
    _barrier()
    flat = _expand_factories(sharded_state_dict)
    if content_metadata is not None:
        flat["content_metadata"] = content_metadata
    shards, index = {}, []
    for sh in flat.values():
        if isinstance(sh, ShardedTensor) and is_main_replica(sh.replica_id):
            name = f"{sh.key}@{','.join(map(str, sh.global_offset))}"
            shards[name] = sh.data.detach().reshape(sh.stored_shape).contiguous().cpu()
            index.append({"key": sh.key, "name": name, "global_shape": list(sh.global_shape),
                          "global_offset": list(sh.global_offset), "shape": list(sh.stored_shape),
                          "dtype": str(sh.dtype).removeprefix("torch.")})
    fname = f"__{rank}_0.pt"
    digest = atomic_write(os.path.join(checkpoint_dir, fname), lambda p: torch.save(shards, p))
    files = {fname: digest}
    if rank == 0:
        common = {k: v for k, v in flat.items() if not isinstance(v, ShardedTensor)}
        files[COMMON] = atomic_write(os.path.join(checkpoint_dir, COMMON), lambda p: torch.save(common, p))
    gathered = _all_gather((fname, index, files))
    if rank == 0:
        tensors, all_files = {}, {}
        for fname_r, index_r, files_r in gathered:
            all_files.update(files_r)
            for e in index_r:
                t = tensors.setdefault(e["key"], {"global_shape": e["global_shape"], "dtype": e["dtype"],
                                                  "shards": []})
                if t["global_shape"] != e["global_shape"]:
                    raise CheckpointingException(f"{e['key']}: ranks disagree on the global shape "
                                                 f"({t['global_shape']} vs {e['global_shape']})")
                t["shards"].append({"file": fname_r, "name": e["name"], "global_offset": e["global_offset"],
                                    "shape": e["shape"]})
        if validate_access_integrity:
            for key, t in tensors.items():
                _check_exact_cover(key, t)
        meta = {"sharded_backend": BACKEND, "sharded_backend_version": 1, "tensors": tensors, "files": all_files}
        atomic_write_text(os.path.join(checkpoint_dir, METADATA), json.dumps(meta, indent=1))
    _barrier()


def load_metadata(checkpoint_dir: str) -> dict:
    path = os.path.join(checkpoint_dir, METADATA)
    if not os.path.exists(path):
        raise CheckpointingException(f"{path} not found: {checkpoint_dir} is not a complete distributed "
                                     "checkpoint (a save that did not finish writes no metadata.json)")
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as e:
        raise CheckpointingException(f"{path} is corrupted: {e}") from e
    if meta.get("sharded_backend") != BACKEND:
        raise CheckpointingException(f"{path}: sharded_backend {meta.get('sharded_backend')!r}, expected {BACKEND!r}")
    return meta


class _ShardFiles:
    """Opens each shard file once, checking it against the sha256 in the metadata."""

    def __init__(self, checkpoint_dir: str, meta: dict):
        self.dir, self.files, self.cache = checkpoint_dir, meta["files"], {}

    def get(self, fname: str, weights_only: bool = True) -> dict:
        if fname not in self.cache:
            path = os.path.join(self.dir, fname)
            if not os.path.exists(path):
                raise CheckpointingException(f"shard file {path} is missing")
            with open(path, "rb") as f:
                raw = f.read()
            if hashlib.sha256(raw).hexdigest() != self.files[fname]:
                raise CheckpointingException(f"shard file {path} is corrupted (sha256 differs from {METADATA})")
            try:
                self.cache[fname] = torch.load(path, weights_only=weights_only)
            except Exception as e:  # noqa: BLE001 - re-raised naming the file
                raise CheckpointingException(f"shard file {path} cannot be read: {e}") from e
        return self.cache[fname]


def _load_tensor(sh: ShardedTensor, meta: dict, files: _ShardFiles) -> torch.Tensor:
    """Assemble ``sh``'s region of the global tensor from every saved shard that overlaps it."""
    entry = meta["tensors"].get(sh.key)
    if entry is None:
        raise CheckpointingException(f"key {sh.key!r} is not in the checkpoint")
    if tuple(entry["global_shape"]) != tuple(sh.global_shape) and not sh.allow_shape_mismatch:
        raise CheckpointingException(f"{sh.key}: global shape {tuple(sh.global_shape)} requested, "
                                     f"checkpoint has {tuple(entry['global_shape'])}")
    out = torch.empty(sh.stored_shape, dtype=sh.dtype)
    want_lo, want_hi = sh.global_offset, [o + s for o, s in zip(sh.global_offset, sh.stored_shape)]
    filled = 0
    for shard in entry["shards"]:
        lo = [max(a, b) for a, b in zip(want_lo, shard["global_offset"])]
        hi = [min(a, b + s) for a, b, s in zip(want_hi, shard["global_offset"], shard["shape"])]
        if any(h <= lo_ for lo_, h in zip(lo, hi)):
            continue
        data = files.get(shard["file"])[shard["name"]]
        src = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, shard["global_offset"]))
        dst = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, want_lo))
        out[dst] = data[src]
        filled += math.prod(b - a for a, b in zip(lo, hi))
    if filled != out.numel():
        raise CheckpointingException(f"{sh.key}: the checkpoint covers {filled} of the {out.numel()} elements "
                                     f"requested at offset {sh.global_offset}")
    return out.reshape(sh.local_shape)


def load(sharded_state_dict: dict, checkpoint_dir: str, sharded_strategy=None, validate_access_integrity: bool = True,
         strict=None, verify_integrity: bool = False, process_group=None) -> dict:
    """Upstream's signature: returns the state dict with every ShardedTensor replaced by its loaded tensor
    (shape ``local_shape``, dtype ``dtype``), factories merged, plain entries from ``common.pt``."""
    if sharded_strategy is not None or process_group is not None:
        raise CheckpointingException(f"load: sharded_strategy={sharded_strategy!r} / process_group="
                                     f"{process_group!r} are not supported (one backend, the default group)")
    if strict not in (None, "assume_ok_unexpected"):
        raise CheckpointingException(f"load: strict={strict!r} is not supported (only upstream's default, "
                                     "'assume_ok_unexpected': a requested key missing from the checkpoint raises)")
    meta = load_metadata(checkpoint_dir)
    files = _ShardFiles(checkpoint_dir, meta)
    common = files.get(COMMON, weights_only=False)
    out = {}
    for name, value in sharded_state_dict.items():
        if isinstance(value, ShardedTensorFactory):
            out[name] = value.merge_fn({sub: _load_tensor(sh, meta, files) for sub, sh in value.build().items()})
        elif isinstance(value, ShardedTensor):
            out[name] = _load_tensor(value, meta, files)
        else:
            out[name] = common.get(name, value)
    return out
