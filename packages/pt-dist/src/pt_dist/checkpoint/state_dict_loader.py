"""``torch.distributed.checkpoint.state_dict_loader``: ``load`` with torch's arguments
(``pt_dist/_compat/checkpoint/state_dict_loader.py``) over the core's ``_load_state_dict``
(``pt_dist/checkpoint/_checkpointer.py``)."""

from pt_dist._compat.checkpoint.state_dict_loader import load, load_state_dict
from pt_dist.checkpoint._checkpointer import _load_state_dict

__all__ = ["load", "load_state_dict"]
_ = (_load_state_dict,)  # torch's private entry, importable from here as from torch's module
