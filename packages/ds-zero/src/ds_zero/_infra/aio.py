"""Asynchronous large reads and writes of tensors to files, the I/O under ZeRO-Infinity's swap files (DeepSpeed's
``deepspeed/ops/aio`` ``aio_handle``; its method names are :mod:`ds_zero._compat.aio_handle`'s).

Each request is cut into ``block_size`` pieces; a pool of ``intra_op_parallelism`` threads issues them, up to
``queue_depth`` consecutive pieces per ``preadv``/``pwritev`` call, so one large transfer keeps the disk busy
from several threads while the caller computes. Files are opened with ``O_DIRECT`` where the filesystem allows
(no page-cache copy); that needs 4 KiB-aligned buffers, offsets and lengths, which :func:`aligned_empty`
and the swappers' layouts provide. Anything unaligned goes through an ordinary descriptor.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

ALIGN = 4096


def round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def aligned_empty(numel: int, dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
    """An uninitialised 1-D tensor whose data starts on a 4 KiB boundary and whose bytes round up to 4 KiB."""
    esize = torch.empty(0, dtype=dtype).element_size()
    nbytes = round_up(max(numel, 1) * esize)
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    off = (-raw.data_ptr()) % ALIGN
    return raw[off:off + nbytes].view(dtype)[:numel]


def _buffer(t: torch.Tensor, nbytes: int):
    """A writable Python buffer over the tensor's bytes (no copy)."""
    return (ctypes.c_char * nbytes).from_address(t.data_ptr())


class _Request:
    """The pieces of one read or write; ``wait()`` returns when all are done (or raises the first error)."""

    def __init__(self, futures: list[Future], tensor: torch.Tensor):
        self.futures = futures
        self.tensor = tensor  # alive until the request is

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def wait(self) -> None:
        for f in self.futures:
            f.result()


class AsyncIOHandle:
    def __init__(self, block_size: int = 1 << 20, queue_depth: int = 8, intra_op_parallelism: int = 1):
        self.block_size = round_up(block_size)
        self.queue_depth = max(1, queue_depth)
        self.pool = ThreadPoolExecutor(max_workers=max(1, intra_op_parallelism), thread_name_prefix="ds_zero-aio")
        self._fds: dict[tuple[str, bool], int] = {}
        self._lock = threading.Lock()
        self.direct_ok: dict[str, bool] = {}

    def _fd(self, path: str, direct: bool) -> int:
        key = (path, direct)
        with self._lock:
            if key not in self._fds:
                flags = os.O_RDWR | os.O_CREAT
                if direct:
                    try:
                        self._fds[key] = os.open(path, flags | os.O_DIRECT, 0o600)
                        self.direct_ok[path] = True
                        return self._fds[key]
                    except OSError as e:
                        if e.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                            raise
                        self.direct_ok[path] = False
                        return self._fd(path, False)
                self._fds[key] = os.open(path, flags, 0o600)
            return self._fds[key]

    def _submit(self, tensor: torch.Tensor, path: str, offset: int, write: bool) -> _Request:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("aio transfers need a contiguous CPU tensor")
        nbytes = tensor.numel() * tensor.element_size()
        aligned = tensor.data_ptr() % ALIGN == 0 and offset % ALIGN == 0 and nbytes % ALIGN == 0
        fd = self._fd(path, direct=aligned)
        whole = _buffer(tensor, nbytes) if nbytes else None
        view = memoryview(whole).cast("B") if nbytes else None
        span = self.block_size * self.queue_depth
        futures = []
        for start in range(0, nbytes, span):
            pieces = [view[s:min(s + self.block_size, nbytes)]
                      for s in range(start, min(start + span, nbytes), self.block_size)]
            # the tensor rides along: the ctypes view does not keep its storage alive until the I/O is done
            futures.append(self.pool.submit(self._io, fd, pieces, offset + start, write, tensor))
        return _Request(futures, tensor)

    @staticmethod
    def _io(fd: int, pieces, offset: int, write: bool, _keepalive) -> int:
        want = sum(len(p) for p in pieces)
        done = os.pwritev(fd, pieces, offset) if write else os.preadv(fd, pieces, offset)
        if done != want:
            raise OSError(errno.EIO, f"short {'write' if write else 'read'}: {done} of {want} bytes at {offset}")
        return done

    # One request object per transfer: the swappers wait on it when they need the data.
    def write(self, tensor: torch.Tensor, path: str, offset: int = 0) -> _Request:
        return self._submit(tensor, path, offset, write=True)

    def read(self, tensor: torch.Tensor, path: str, offset: int = 0) -> _Request:
        return self._submit(tensor, path, offset, write=False)

    def reserve(self, path: str, nbytes: int) -> None:
        """Claim the file's blocks now, so a full disk fails at start-up, not at the first swap-out."""
        fd = self._fd(path, direct=False)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"no space on {os.path.dirname(path)!r} for {nbytes / 2**20:.1f} MiB "
                                            "of swapped tensors") from e
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(fd, nbytes)  # no fallocate here: at least size the file

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
