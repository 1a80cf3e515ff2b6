"""Files that survive a crash, and files read back checked (the I/O under DCP's ``FileSystemWriter`` /
``FileSystemReader``; no pt_dist imports).

``DurableFile``: a file written blob by blob, each at the offset it returns, its size and CRC-32 kept, fsynced on
close. ``atomic_write``: bytes written to a temporary name beside the target, fsynced, renamed over it, the
directory fsynced: a reader sees the old file or the new one, never a part. ``read_checked``: a file mapped into
memory and compared with the size and CRC-32 its writer recorded, an error naming it when it is missing or
differs. ``BufferView``: a read-only file over a slice of such a mapping, so ``torch.load`` reads a blob where it
lies, without a copy.
"""

from __future__ import annotations

import io
import mmap
import os
import uuid
import zlib
from pathlib import Path

__all__ = ["BufferView", "DurableFile", "atomic_write", "fsync_dir", "read_checked"]


def fsync_dir(path: Path) -> None:
    """The directory's entries (new names, a rename) made durable too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableFile:
    """``with DurableFile(path, sync) as f: offset = f.write(blob)``; then ``f.size`` and ``f.crc``."""

    def __init__(self, path: Path, sync: bool = True) -> None:
        self._file, self._sync = open(path, "wb"), sync
        self.size, self.crc = 0, 0

    def write(self, blob) -> int:
        offset = self.size
        self._file.write(blob)
        self.crc = zlib.crc32(blob, self.crc)
        self.size += len(blob)
        return offset

    def __enter__(self) -> DurableFile:
        return self

    def __exit__(self, *exc) -> None:
        with self._file:
            if self._sync and exc[0] is None:
                self._file.flush()
                os.fsync(self._file.fileno())


def atomic_write(path: Path, data: bytes, sync: bool = True) -> None:
    """``path`` holds ``data`` or what it held before, whatever happens meanwhile (the temporary file is named
    ``<name>.<hex>.tmp``: a writer that died leaves one for its next commit to remove)."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def read_checked(path: Path, what: str, expected: tuple[int, int] | None = None) -> memoryview:
    """The file mapped read-only, checked against ``expected`` (size, CRC-32) when given; ``what`` names it in
    the errors."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} is missing") from None
    with f:
        size_on_disk = os.fstat(f.fileno()).st_size
        blob = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size_on_disk else b"")
    if expected is not None:
        if len(blob) != expected[0]:
            raise ValueError(f"{what} {path} is corrupt: {len(blob)} bytes, the save wrote {expected[0]}")
        if zlib.crc32(blob) != expected[1]:
            raise ValueError(f"{what} {path} is corrupt: its CRC-32 differs from the save's")
    return blob


class BufferView(io.RawIOBase):
    """A read-only, seekable file over a memoryview."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos: self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence] + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos
