"""``torch.distributed.tensor.parallel.input_reshard`` (``pt_dist/_compat/tensor/parallel/input_reshard.py``)."""

from pt_dist._compat.tensor.parallel.input_reshard import input_reshard

__all__ = ["input_reshard"]
