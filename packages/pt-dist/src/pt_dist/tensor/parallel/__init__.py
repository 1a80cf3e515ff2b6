"""``pt_dist.tensor.parallel``: torch's tensor-parallel API (``torch/distributed/tensor/parallel/``) over pt_dist's
DTensor; the styles, ``parallelize_module`` and ``loss_parallel`` live in ``pt_dist/_compat/tensor/parallel/``."""

from pt_dist._compat.tensor.parallel.api import parallelize_module
from pt_dist._compat.tensor.parallel.loss import loss_parallel
from pt_dist._compat.tensor.parallel.style import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
           "RowwiseParallel", "SequenceParallel", "loss_parallel", "parallelize_module"]
