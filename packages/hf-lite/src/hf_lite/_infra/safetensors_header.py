"""A safetensors header read and checked before any tensor is: every tensor's byte range must fit its dtype and
shape and the file's size, so a truncated or corrupted checkpoint fails naming the file and the tensor (the
safetensors format: an 8-byte little-endian header length, a JSON header, the data)."""

from __future__ import annotations

import json
import os
import struct

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


class CheckpointError(OSError):
    """A checkpoint file is missing, truncated, corrupted or does not match the model."""


def read_safetensors_header(file: str) -> dict[str, dict]:
    """Parse and check a safetensors header: every tensor's byte range must fit its dtype*shape and the file size."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{file} is truncated: {size} bytes, not even a safetensors header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > size:
            raise CheckpointError(
                f"{file} is truncated or corrupted: header claims {header_len} bytes, file has {size}"
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{file} has a corrupted safetensors header: {err}") from err
    header.pop("__metadata__", None)
    data_size = size - 8 - header_len
    for name, info in header.items():
        try:
            start, end = info["data_offsets"]
            n = 1
            for dim in info["shape"]:
                n *= dim
            itemsize = _DTYPE_BYTES.get(info["dtype"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{file}: tensor {name!r} has a corrupted header entry {info!r}") from err
        if end > data_size:
            raise CheckpointError(
                f"{file} is truncated: tensor {name!r} needs bytes [{start}, {end}) "
                f"but the data section has {data_size}"
            )
        if itemsize is not None and end - start != n * itemsize:
            raise CheckpointError(f"{file}: tensor {name!r} spans {end - start} bytes, its shape needs {n * itemsize}")
    return header
