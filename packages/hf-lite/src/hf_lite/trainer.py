"""``hf_lite.trainer`` (transformers' ``trainer.py``): ``Trainer`` is the core loop (``trainer_loop.py``: ``train`` ->
``_inner_training_loop`` -> ``training_step`` -> ``compute_loss``, evaluation, checkpoints) with transformers'
defaults and script methods around it (``_compat/trainer.py``)."""

from ._compat.trainer import Trainer

__all__ = ["Trainer"]
