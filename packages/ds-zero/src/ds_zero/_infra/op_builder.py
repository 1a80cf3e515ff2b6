"""Just-in-time C++ ops, DeepSpeed's ``op_builder`` (``CPUAdamBuilder().load()``) on ``torch.utils.cpp_extension``.

The source is compiled on first use into torch's extension cache (``TORCH_EXTENSIONS_DIR``), so later
processes load it in milliseconds. ``DS_ZERO_BUILD_OPS=0`` (or no compiler) means ``load()`` raises
:class:`OpBuildError` and callers take their pure-torch path, saying so once in the log.
"""

from __future__ import annotations

import logging
import os
import shutil

logger = logging.getLogger(__name__)

# the C++ sources ship in ds_zero/ops/csrc
_CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "csrc")


class OpBuildError(RuntimeError):
    """The op cannot be built here (no compiler, disabled, or the compile failed)."""


class OpBuilder:
    NAME = ""
    SOURCES: list[str] = []

    _loaded: dict = {}

    def is_compatible(self) -> tuple[bool, str]:
        if os.environ.get("DS_ZERO_BUILD_OPS", "1") == "0":
            return False, "DS_ZERO_BUILD_OPS=0"
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            return False, f"no C++ compiler ({os.environ.get('CXX', 'c++')!r} not on PATH)"
        return True, ""

    def cxx_args(self) -> list[str]:
        return ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-std=c++20"]

    def load(self, verbose: bool = False):
        key = self.NAME
        if key in self._loaded:
            return self._loaded[key]
        ok, why = self.is_compatible()
        if not ok:
            raise OpBuildError(f"{self.NAME} not built: {why}")
        from torch.utils.cpp_extension import load

        sources = [os.path.join(_CSRC, s) for s in self.SOURCES]
        try:
            # A plain shared library whose TORCH_LIBRARY block registers torch.ops.ds_zero.*: no pybind, so the
            # first build takes seconds, not the minute torch/extension.h costs.
            load(
                name=f"ds_zero_{self.NAME}",
                sources=sources,
                extra_cflags=self.cxx_args(),
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=verbose,
            )
        except Exception as e:  # compiler errors surface as RuntimeError / subprocess errors
            raise OpBuildError(f"{self.NAME} failed to build: {e}") from e
        import torch

        module = torch.ops.ds_zero
        self._loaded[key] = module
        return module


class CPUAdamBuilder(OpBuilder):
    NAME = "cpu_adam"
    SOURCES = ["adam/cpu_adam.cpp"]
