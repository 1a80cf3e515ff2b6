"""pytest plugin (entry point ``pytest11``): markers for GPU and multi-rank tests, Triton's interpreter on machines
without CUDA, pool teardown."""

from __future__ import annotations

import os

import pytest


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
