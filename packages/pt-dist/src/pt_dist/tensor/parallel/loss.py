"""torch's ``torch/distributed/tensor/parallel/loss.py`` path (``pt_dist/_compat/tensor/parallel/loss.py``)."""

from pt_dist._compat.tensor.parallel.loss import loss_parallel

__all__ = ["loss_parallel"]
