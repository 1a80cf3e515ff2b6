"""``get_megatron_optimizer``: Megatron's entry point (``megatron/core/optimizer/__init__.py``), picking the
plain or the distributed optimizer from the config."""

from __future__ import annotations

from mega_par.optimizer.distrib_optimizer import DistributedOptimizer
from mega_par.optimizer.optimizer import MegatronOptimizer, OptimizerConfig


def get_megatron_optimizer(config: OptimizerConfig, model_chunks, no_weight_decay_cond=None):
    """The distributed optimizer when ``config.use_distributed_optimizer``, else the plain one.

    ``no_weight_decay_cond(name, param) -> bool`` exempts parameters from weight decay; None means Megatron's
    default (biases and 1-D parameters such as norm weights).
    """
    if config.use_distributed_optimizer:
        return DistributedOptimizer(config, model_chunks, no_weight_decay_cond)
    return MegatronOptimizer(config, model_chunks, no_weight_decay_cond)
