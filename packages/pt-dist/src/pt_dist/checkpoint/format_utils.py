"""torch's ``torch/distributed/checkpoint/format_utils.py`` path (``pt_dist/_compat/checkpoint/format_utils.py``)."""

from pt_dist._compat.checkpoint.format_utils import (
    BroadcastingTorchSaveReader,
    DynamicMetaLoadPlanner,
    dcp_to_torch_save,
    torch_save_to_dcp,
)

__all__ = ["BroadcastingTorchSaveReader", "DynamicMetaLoadPlanner", "dcp_to_torch_save", "torch_save_to_dcp"]
