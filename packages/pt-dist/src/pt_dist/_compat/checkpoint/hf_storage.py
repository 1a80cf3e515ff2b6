"""``HuggingFaceStorageReader`` (torch/distributed/checkpoint/hf_storage.py): a Hugging Face checkpoint directory
(``*.safetensors`` files) read as a DCP checkpoint, so ``pt_dist.checkpoint.load`` fills a state dict of DTensors
(or plain tensors) from it, each rank reading only the rows its shards need. The safetensors format is read here
directly (an 8-byte little-endian header length, a JSON header of dtype, shape and byte range per tensor, then the
data); files torch's ``HuggingFaceStorageWriter`` wrote in shards carry each chunk's offset in the header's
``__metadata__["DCP_SHARDING_INFO"]``, as torch reads them."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from torch.futures import Future

from pt_dist.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from pt_dist.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from pt_dist.checkpoint.storage import FileSystemReader
from pt_dist.checkpoint.utils import narrow_tensor_by_index

__all__ = ["HuggingFaceStorageReader"]

SUFFIX = ".safetensors"
CUSTOM_METADATA_KEY = "DCP_SHARDING_INFO"
SAVED_OFFSETS_KEY = "saved_offsets"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's JSON header and where its data starts."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


class HuggingFaceStorageReader(FileSystemReader):
    """Read a directory of ``.safetensors`` files as a checkpoint (``thread_count`` accepted: files are read one
    after another)."""

    def __init__(self, path: str | os.PathLike, thread_count: int = 1) -> None:
        super().__init__(path)
        self.thread_count = thread_count

    def read_metadata(self, *args, **kwargs) -> Metadata:
        tensors: dict[str, TensorStorageMetadata] = {}
        where: dict[MetadataIndex, tuple] = {}
        files = sorted(p for p in Path(self.path).iterdir() if p.name.endswith(SUFFIX))
        if not files:
            raise FileNotFoundError(f"HuggingFaceStorageReader: no {SUFFIX} files in {self.path}")
        for path in files:
            header, data_start = _header(path)
            extra = header.pop("__metadata__", None) or {}
            sharding = json.loads(extra[CUSTOM_METADATA_KEY]) if CUSTOM_METADATA_KEY in extra else None
            for key, info in header.items():
                if info["dtype"] not in _DTYPES:
                    raise ValueError(f"HuggingFaceStorageReader: {path.name}: {key} has dtype {info['dtype']}, "
                                     f"not one of {sorted(_DTYPES)}")
                shape, dtype = torch.Size(info["shape"]), _DTYPES[info["dtype"]]
                offset = torch.Size(sharding[key][SAVED_OFFSETS_KEY] if sharding else [0] * len(shape))
                chunk = ChunkStorageMetadata(offsets=offset, sizes=shape)
                end = torch.Size(o + s for o, s in zip(offset, shape))
                if key in tensors:  # another shard of the same tensor: the global size grows to cover it
                    md = tensors[key]
                    md.chunks.append(chunk)
                    md.size = torch.Size(max(a, b) for a, b in zip(md.size, end))
                else:
                    tensors[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), end, [chunk])
                start, stop = info["data_offsets"]
                where[MetadataIndex(key, offset)] = (path.name, data_start + start, stop - start, dtype, shape)
        return Metadata(state_dict_metadata=tensors, storage_data=where,
                        storage_meta=StorageMeta(checkpoint_id=self.path, load_id=self.load_id))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.storage_data = dict(metadata.storage_data)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Each requested box read from its tensor's bytes in the file, copied into the planner's tensor."""
        per_file: dict[str, list] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise ValueError(f"HuggingFaceStorageReader: {item.dest_index.fqn} is not a tensor; safetensors "
                                 "files hold tensors only")
            per_file.setdefault(self.storage_data[item.storage_index][0], []).append(item)
        for name, items in per_file.items():
            with (Path(self.path) / name).open("rb") as f:
                for req in items:
                    _, offset, length, dtype, shape = self.storage_data[req.storage_index]
                    f.seek(offset)
                    raw = bytearray(f.read(length))
                    whole = torch.frombuffer(raw, dtype=dtype).reshape(shape) if length else torch.empty(
                        shape, dtype=dtype)
                    piece = narrow_tensor_by_index(whole, req.storage_offsets, req.lengths)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != piece.size():
                        raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs "
                                             f"{piece.size()}")
                    target.copy_(piece)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut
