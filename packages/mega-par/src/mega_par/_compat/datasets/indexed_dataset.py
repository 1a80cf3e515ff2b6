"""``IndexedDataset`` / ``IndexedDatasetBuilder``: token ids in ``<prefix>.bin``, their index in ``<prefix>.idx``
(``megatron/core/datasets/indexed_dataset.py``, the format its ``tools/preprocess_data.py`` writes).

``.idx`` layout (little-endian)::

    b"MMIDIDX\\x00\\x00"        9 bytes, the header
    version                   uint64, 1
    dtype code                uint8 (DType: uint8 1, int8 2, int16 3, int32 4, int64 5, float64 6, float32 7,
                              uint16 8)
    sequence count            uint64
    document count            uint64 (number of document indices = documents + 1)
    sequence lengths          int32  x sequence count
    sequence pointers         int64  x sequence count (byte offsets into .bin)
    document indices          int64  x document count (sequence index where each document starts; last = count)
    sequence modes            int8   x sequence count (multimodal only)

``.bin`` is the sequences' token ids back to back in the dtype of the code.
"""

from __future__ import annotations

import os
import struct
from enum import Enum

import numpy
import torch

_INDEX_HEADER = b"MMIDIDX\x00\x00"


class DType(Enum):
    """The dtype codes of the ``.idx`` header (upstream's enum)."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_from_dtype(cls, value) -> int:
        return cls[numpy.dtype(value).name].value

    @classmethod
    def dtype_from_code(cls, value: int):
        try:
            return getattr(numpy, cls(value).name)
        except ValueError:
            raise ValueError(f"unknown IndexedDataset dtype code {value} (known: 1-8)") from None

    @staticmethod
    def size(key) -> int:
        return numpy.dtype(DType.dtype_from_code(key) if isinstance(key, int) else key).itemsize

    @staticmethod
    def optimal_dtype(cardinality: int | None):
        """uint16 for vocabularies under 65500 ids, else int32 (upstream's rule)."""
        return numpy.uint16 if cardinality is not None and cardinality < 65500 else numpy.int32


def get_idx_path(path_prefix: str) -> str:
    return path_prefix + ".idx"


def get_bin_path(path_prefix: str) -> str:
    return path_prefix + ".bin"


class IndexedDatasetBuilder:
    """Appends sequences to ``bin_path``; ``finalize(idx_path)`` writes the index (upstream's API)."""

    def __init__(self, bin_path: str, dtype=numpy.int32, multimodal: bool = False) -> None:
        self.data_file = open(bin_path, "wb")
        self.dtype, self.multimodal = dtype, multimodal
        self.sequence_lengths: list[int] = []
        self.document_indices: list[int] = [0]
        self.sequence_modes: list[int] | None = [] if multimodal else None

    def add_item(self, tensor: torch.Tensor, mode: int = 0) -> None:
        """One sequence (close the document with ``end_document``)."""
        array = numpy.array(tensor.numpy() if isinstance(tensor, torch.Tensor) else tensor, dtype=self.dtype)
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.append(array.size)
        if self.multimodal:
            self.sequence_modes.append(mode)

    def add_document(self, tensor, lengths: list[int], modes: list[int] | None = None) -> None:
        """A whole document: its tokens and the lengths of its sequences."""
        array = numpy.array(tensor.numpy() if isinstance(tensor, torch.Tensor) else tensor, dtype=self.dtype)
        if array.size != sum(lengths):
            raise ValueError(f"add_document: {array.size} tokens but lengths {lengths} sum to {sum(lengths)}")
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))
        if self.multimodal:
            self.sequence_modes.extend(modes if modes is not None else [0] * len(lengths))

    def end_document(self) -> None:
        self.document_indices.append(len(self.sequence_lengths))

    def finalize(self, idx_path: str) -> None:
        self.data_file.close()
        pointers = numpy.concatenate([[0], numpy.cumsum(self.sequence_lengths, dtype=numpy.int64)[:-1]]) \
            * DType.size(self.dtype) if self.sequence_lengths else numpy.zeros(0, numpy.int64)
        with open(idx_path, "wb") as f:
            f.write(_INDEX_HEADER)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", DType.code_from_dtype(self.dtype)))
            f.write(struct.pack("<Q", len(self.sequence_lengths)))
            f.write(struct.pack("<Q", len(self.document_indices)))
            f.write(numpy.array(self.sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
            f.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
            f.write(numpy.array(self.document_indices, dtype=numpy.int64).tobytes(order="C"))
            if self.sequence_modes is not None:
                f.write(numpy.array(self.sequence_modes, dtype=numpy.int8).tobytes(order="C"))


class _IndexReader:
    def __init__(self, idx_path: str, multimodal: bool) -> None:
        with open(idx_path, "rb") as f:
            header = f.read(9)
            if header != _INDEX_HEADER:
                raise ValueError(f"bad header {header!r}, cannot read: {idx_path}")
            version = struct.unpack("<Q", f.read(8))[0]
            if version != 1:
                raise ValueError(f"bad version {version}, cannot read: {idx_path}")
            self.dtype = DType.dtype_from_code(struct.unpack("<B", f.read(1))[0])
            self.sequence_count, self.document_count = struct.unpack("<QQ", f.read(16))
            offset = f.tell()
        buf = numpy.memmap(idx_path, mode="r", order="C")
        n = self.sequence_count
        self.sequence_lengths = numpy.frombuffer(buf, numpy.int32, n, offset)
        offset += self.sequence_lengths.nbytes
        self.sequence_pointers = numpy.frombuffer(buf, numpy.int64, n, offset)
        offset += self.sequence_pointers.nbytes
        self.document_indices = numpy.frombuffer(buf, numpy.int64, self.document_count, offset)
        offset += self.document_indices.nbytes
        self.sequence_modes = numpy.frombuffer(buf, numpy.int8, n, offset) if multimodal else None


class IndexedDataset(torch.utils.data.Dataset):
    """Sequence ``i`` of ``<path_prefix>.bin`` as a numpy array (``.bin`` memory-mapped); upstream's API."""

    def __init__(self, path_prefix: str, multimodal: bool = False, mmap: bool = True, object_storage_config=None,
                 s3_config=None, fast_cache_load: bool = False, sequences_per_dataset=None, dtype_code=None) -> None:
        super().__init__()
        for name, value in (("object_storage_config", object_storage_config), ("s3_config", s3_config),
                            ("sequences_per_dataset", sequences_per_dataset), ("dtype_code", dtype_code)):
            if value is not None:
                raise ValueError(f"IndexedDataset: {name}={value!r} is not supported by mega_par (local files only)")
        for path in (get_idx_path(path_prefix), get_bin_path(path_prefix)):
            if not os.path.exists(path):
                raise FileNotFoundError(f"IndexedDataset: {path} not found")
        self.path_prefix, self.multimodal = path_prefix, multimodal
        self.index = _IndexReader(get_idx_path(path_prefix), multimodal)
        if self.index.document_indices[-1] != self.index.sequence_count:
            raise ValueError(f"{get_idx_path(path_prefix)}: last document index {self.index.document_indices[-1]} "
                             f"!= sequence count {self.index.sequence_count}")
        self.bin = numpy.memmap(get_bin_path(path_prefix), mode="r", order="C") if mmap else \
            numpy.fromfile(get_bin_path(path_prefix), dtype=numpy.uint8)

    def __len__(self) -> int:
        return self.index.sequence_count

    def get(self, idx: int, offset: int = 0, length: int | None = None):
        """Tokens ``[offset, offset + length)`` of sequence ``idx`` (with its mode when multimodal)."""
        pointer, size = int(self.index.sequence_pointers[idx]), int(self.index.sequence_lengths[idx])
        if length is None:
            length = size - offset
        itemsize = DType.size(self.index.dtype)
        seq = numpy.frombuffer(self.bin, self.index.dtype, length, pointer + offset * itemsize)
        return (seq, self.index.sequence_modes[idx]) if self.multimodal else seq

    def __getitem__(self, idx):
        if isinstance(idx, (int, numpy.integer)):
            return self.get(int(idx))
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("Slices into indexed_dataset must be contiguous")
            return [self.get(i) for i in range(start, stop)]
        raise TypeError(f"Unexpected type received for idx: {type(idx)}")

    @property
    def sequence_lengths(self) -> numpy.ndarray:
        return self.index.sequence_lengths

    @property
    def document_indices(self) -> numpy.ndarray:
        return self.index.document_indices

    @staticmethod
    def exists(path_prefix: str) -> bool:
        return os.path.exists(get_idx_path(path_prefix)) and os.path.exists(get_bin_path(path_prefix))
