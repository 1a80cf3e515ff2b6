"""DeepSpeed's ``op_builder`` (``CPUAdamBuilder().load()``); the just-in-time build lives in
:mod:`ds_zero._infra.op_builder`."""

from ds_zero._infra.op_builder import CPUAdamBuilder, OpBuilder, OpBuildError

__all__ = ["CPUAdamBuilder", "OpBuildError", "OpBuilder"]
