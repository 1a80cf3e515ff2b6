"""pytest plugin (entry point ``pytest11``): markers for GPU and multi-rank tests, Triton's interpreter on machines
without CUDA, pool teardown."""

from __future__ import annotations

import os
import sys

import pytest


def _one_intra_op_thread() -> None:
    """One OpenMP thread per test process unless OMP_NUM_THREADS says otherwise, as torchrun gives its ranks.

    The suite's processes (the xdist workers, the ranks and subprocesses of multi-rank tests) already outnumber
    the cores; with torch's default of a thread per core, OpenMP's spinning barriers make every parallel op wait
    for threads the scheduler has parked: a file of tiny-model tests took 7x as long beside another one.
    Subprocesses inherit the variable. Runs when pytest loads this plugin, before test modules import torch.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported before this plugin (by another plugin): OpenMP has read the variable
        sys.modules["torch"].set_num_threads(1)


_one_intra_op_thread()


def pytest_configure(config):
    # Triton chooses interpreted or compiled kernels once per process, and some test dependencies (evaluate among
    # them) import it while their test modules are collected, long before paged-serve's conftest could set this:
    # decide for the whole session before anything is collected.
    if "TRITON_INTERPRET" not in os.environ:
        from harness import cuda_device_count

        if cuda_device_count() == 0:
            os.environ["TRITON_INTERPRET"] = "1"
    config.addinivalue_line("markers", "gpu(n=1): needs n CUDA devices; skipped otherwise")
    config.addinivalue_line("markers", "world_size(n): the number of ranks a multi-rank test runs on")
    config.addinivalue_line("markers", "slow: long-running; still part of the default suite")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from harness import cuda_device_count

    have = cuda_device_count()
    for item in gpu_items:
        marker = item.get_closest_marker("gpu")
        need = marker.args[0] if marker.args else marker.kwargs.get("n", 1)
        if have < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device(s), found {have}"))


@pytest.fixture
def world_size(request) -> int:
    """The ``world_size(n)`` marker's value (or a parametrized ``world_size``)."""
    marker = request.node.get_closest_marker("world_size")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses the world_size fixture without a world_size(n) marker")
    return marker.args[0]


def pytest_sessionfinish(session, exitstatus):
    from harness.ranks import shutdown

    shutdown()
