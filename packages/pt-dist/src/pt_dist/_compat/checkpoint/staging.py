"""``async_save``'s staging (torch/distributed/checkpoint/staging.py): a copy of the state dict in CPU memory, so
training may change the model while the copy is written. ``AsyncStager`` is the protocol, ``BlockingAsyncStager``
copies on the caller's thread (optionally into a kept copy), ``DefaultStager`` on a thread of its own when
``StagingOptions.use_async_staging`` (then ``stage`` returns a ``Future``). Pinned, shared and non-blocking copies
are CUDA's; on the CPU they are plain copies."""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from pt_dist._compat.checkpoint.state_dict_utils import _map_tensors
from pt_dist.checkpoint.metadata import STATE_DICT_TYPE
from pt_dist.tensor import DTensor

__all__ = ["AsyncStager", "BlockingAsyncStager", "DefaultStager", "StagingOptions"]


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, DTensor):
        return DTensor.from_local(_cpu_copy(t.to_local()), t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())
    return t.detach().to("cpu", copy=True)


def _create_cpu_state_dict(state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
    """``state_dict`` with every tensor (a DTensor's local part) copied to the CPU; other values as they are."""
    return _map_tensors(state_dict, _cpu_copy)


def _copy_state_dict(src: Any, dst: Any) -> Any:
    """Copy ``src``'s tensors into ``dst``'s, a staged copy of the same structure; returns ``dst``."""
    if isinstance(src, dict):
        if set(src) != set(dst):
            raise ValueError(f"staged state dict: the keys changed since it was cached ({sorted(set(src) ^ set(dst))})")
        for k in src:
            dst[k] = _copy_state_dict(src[k], dst[k])
        return dst
    if isinstance(src, (list, tuple)):
        return type(src)(_copy_state_dict(s, d) for s, d in zip(src, dst))
    if isinstance(src, torch.Tensor):
        local, into = (src.to_local(), dst.to_local()) if isinstance(src, DTensor) else (src, dst)
        into.copy_(local.detach())
        return dst
    return src


class AsyncStager:
    """The staging protocol ``async_save`` calls: ``stage`` returns a copy training cannot change (or a Future
    of one); if ``should_synchronize_after_execute``, ``synchronize_staging`` runs once the upload has started."""

    _synchronize_after_execute: bool = True

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: STATE_DICT_TYPE) -> Future | STATE_DICT_TYPE:
        raise NotImplementedError(f"{self.__class__.__name__} must implement stage method")

    def synchronize_staging(self) -> None:
        warnings.warn("`synchronize_staging` is deprecated and will be removed in future versions.Please use "
                      "staging_future from AsyncSaveResponse instead.", FutureWarning, stacklevel=2)

    def close(self) -> None:
        """Free what the stager holds."""


@dataclass
class StagingOptions:
    use_pinned_memory: bool = True
    use_shared_memory: bool = True
    use_async_staging: bool = True
    use_non_blocking_copy: bool = True


class DefaultStager(AsyncStager):
    """Stage on the caller's thread, or with ``use_async_staging`` on a thread of the stager's (a ``Future``)."""

    def __init__(self, config: StagingOptions = StagingOptions()):  # noqa: B008  (torch's default)
        if config.use_non_blocking_copy and not torch.cuda.is_available():
            raise AssertionError("Non-blocking copy requires that the current accelerator is available.")
        self._config = config
        self._staging_executor = ThreadPoolExecutor(max_workers=1) if config.use_async_staging else None
        self._staging_future: Future | None = None

    def stage(self, state_dict: STATE_DICT_TYPE, **kwargs: Any) -> STATE_DICT_TYPE | Future:
        if self._staging_executor is None:
            return _create_cpu_state_dict(state_dict)
        self._staging_future = self._staging_executor.submit(_create_cpu_state_dict, state_dict)
        return self._staging_future

    def close(self) -> None:
        if self._staging_executor is not None:
            self._staging_executor.shutdown(wait=True)

    def synchronize_staging(self) -> None:
        if self._staging_future is not None:
            self._staging_future.result()


class BlockingAsyncStager(AsyncStager):
    """Stage on the caller's thread; with ``cache_staged_state_dict`` into one copy kept for every later save."""

    _synchronize_after_execute: bool = False

    def __init__(self, cache_staged_state_dict: bool = False, type_check: bool = False):
        self.cache_staged_state_dict, self.type_check = cache_staged_state_dict, type_check
        self.state_dict_cache: STATE_DICT_TYPE | None = None

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        if not self.cache_staged_state_dict:
            return _create_cpu_state_dict(state_dict)
        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict)
            return self.state_dict_cache
        return _copy_state_dict(state_dict, self.state_dict_cache)

    def synchronize_staging(self) -> None:
        """Staging blocks: nothing to wait for."""

    def close(self) -> None:
        pass
