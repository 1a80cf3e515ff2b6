"""``torch.distributed.checkpoint.state_dict_saver``: ``save`` with torch's arguments
(``pt_dist/_compat/checkpoint/state_dict_saver.py``) over the core's ``_save_state_dict``
(``pt_dist/checkpoint/_checkpointer.py``)."""

from pt_dist._compat.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
    async_save,
    save,
    save_state_dict,
)
from pt_dist.checkpoint._checkpointer import _save_state_dict

__all__ = ["AsyncCheckpointerType", "AsyncSaveResponse", "async_save", "save", "save_state_dict"]
_ = (_save_state_dict,)  # torch's private entry, importable from here as from torch's module
