"""torch's ``torch/distributed/tensor/parallel/style.py`` path (``pt_dist/_compat/tensor/parallel/style.py``)."""

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
           "RowwiseParallel", "SequenceParallel"]
