"""The backend registry (torch.distributed.Backend): a name -> a function that builds a ProcessGroup.

``Backend.register_backend(name, creator)`` adds third-party backends, as in torch. Creators take
``(store, rank, size, timeout_s, group_name, secret, global_ranks)``; ``store`` is already namespaced
for the group. pt-dist's own ``tcp`` and ``shm`` register here; torch's ``gloo``/``nccl``/``mpi`` register from
``_compat/torch_adapter.py`` as *torch-backed*: their creator also has ``check_available()`` (raises before any
communication when this build or machine cannot run it) and ``new_subgroup(global_ranks, timeout, group_name,
**options)`` (torch makes a sub-group collectively, every rank of the world calling).
"""

from __future__ import annotations

import os

import torch

from pt_dist._infra.errors import DistError


class Backend(str):
    TCP = "tcp"
    SHM = "shm"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    _plugins: dict = {}

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, got {name!r}")
        value = name.lower()
        if value not in cls._plugins:
            raise ValueError(f"unknown backend {name!r}; registered: {sorted(cls._plugins)}")
        return super().__new__(cls, value)

    @classmethod
    def register_backend(cls, name: str, func, torch_backed: bool = False) -> None:
        """As torch's: ``name`` becomes a backend ``init_process_group`` takes, and ``Backend.NAME`` (upper case)
        its value."""
        cls._plugins[name.lower()] = (func, torch_backed)
        setattr(cls, name.upper(), name.lower())

    @classmethod
    def creator(cls, name: str):
        return cls._plugins[Backend(name)][0]

    @classmethod
    def is_torch_backed(cls, name: str) -> bool:
        return cls._plugins[Backend(name)][1]


def _tcp(store, rank, size, timeout, group_name, secret, global_ranks):
    from pt_dist.backends.tcp import ProcessGroupTCP

    return ProcessGroupTCP(store, rank, size, timeout, group_name, secret,
                           host=os.environ.get("PT_DIST_LISTEN_ADDR", "127.0.0.1"))


def _shm(store, rank, size, timeout, group_name, secret, global_ranks):
    from pt_dist.backends.shm import ProcessGroupSHM

    return ProcessGroupSHM(store, rank, size, timeout, group_name, secret)


Backend.register_backend("tcp", _tcp)
Backend.register_backend("shm", _shm)


def check_available(name: str) -> None:
    """Raise (``DistError``) before any communication when backend ``name`` cannot run here."""
    if Backend.is_torch_backed(name):
        Backend.creator(name).check_available()


def is_backend_available(backend: str) -> bool:
    """Registered here, and for torch's backends runnable in this build and machine (nccl: NCCL and a GPU)."""
    try:
        check_available(Backend(backend))
    except (ValueError, DistError):
        return False
    return True


def get_default_backend_for_device(device) -> str:
    """What ``init_process_group`` picks for a device: ``tcp`` for CPU tensors (ours; torch's picks gloo), nccl
    for CUDA's."""
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    defaults = {"cpu": Backend.TCP, "cuda": Backend.NCCL}
    if kind not in defaults:
        raise ValueError(f"no default backend for device {device!r}; known: {sorted(defaults)}")
    return defaults[kind]


def library_options_for(name: str, pg_options, device_id, what: str = "init_process_group") -> dict:
    """``device_id`` and ``pg_options`` as backend ``name`` takes them: torch's groups get them (checked where torch
    would check only after rendezvous), the native backends move CPU tensors and take neither."""
    if isinstance(device_id, int):
        device_id = torch.device("cuda", device_id)
    if device_id is not None and not isinstance(device_id, torch.device):
        raise ValueError(f"{what}: device_id must be a torch.device or an int, got {device_id!r}")
    if Backend.is_torch_backed(name):
        if device_id is not None and device_id.index is None:  # torch refuses it too, but only after rendezvous
            raise ValueError(f"{what}: device_id={device_id} needs an index for torch's groups "
                             f"(cpu:0, cuda:0)")
        return {k: v for k, v in (("device_id", device_id), ("pg_options", pg_options)) if v is not None}
    if device_id is not None and device_id.type != "cpu":
        raise ValueError(f"{what}: backend {name!r} moves CPU tensors; device_id={device_id} needs "
                         f"'nccl' (or leave device_id out)")
    if pg_options is not None:
        raise ValueError(f"{what}: backend {name!r} takes no pg_options, got {pg_options!r}")
    return {}
