"""ZeRO-Infinity's swap-file I/O under DeepSpeed's ``aio_handle`` names; the transfers live in
:mod:`ds_zero._infra.aio`, the DeepSpeed interface in :mod:`ds_zero._compat.aio_handle`."""

from ds_zero._compat.aio_handle import AsyncIOHandle
from ds_zero._infra.aio import ALIGN, _buffer, aligned_empty, round_up

__all__ = ["ALIGN", "AsyncIOHandle", "_buffer", "aligned_empty", "round_up"]
