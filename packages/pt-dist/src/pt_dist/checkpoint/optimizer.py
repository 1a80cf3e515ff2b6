"""``torch.distributed.checkpoint.optimizer``: ``load_sharded_optimizer_state_dict``
(``pt_dist/_compat/checkpoint/optimizer.py``)."""

from pt_dist._compat.checkpoint.optimizer import load_sharded_optimizer_state_dict

__all__ = ["load_sharded_optimizer_state_dict"]
