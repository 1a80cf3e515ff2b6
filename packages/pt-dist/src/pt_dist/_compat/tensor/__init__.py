"""What ``torch.distributed.tensor`` offers beyond DTensor's mechanism: the breadth of the op table (views,
tensor ops, random fills, more element-wise ops, ``bmm``, the reductions beyond ``sum``, the element-wise ops that
keep a Partial: importing this registers their rules), the factories and ``distribute_module``."""

from pt_dist._compat.tensor import (  # noqa: F401
    attention_ops,
    embedding_ops,
    foreach_ops,
    linear_pointwise_ops,
    math_ops,
    matrix_ops,
    pointwise_ops,
    random_ops,
    tensor_ops,
    view_ops,
)
from pt_dist._compat.tensor.distribute_module import distribute_module
from pt_dist._compat.tensor.factories import empty, full, linspace, logspace, ones, rand, randn, zeros

__all__ = ["distribute_module", "empty", "full", "linspace", "logspace", "ones", "rand", "randn", "zeros"]
