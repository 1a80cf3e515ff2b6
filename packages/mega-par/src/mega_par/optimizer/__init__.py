"""Optimizers over mega_par's grad buffers: plain and distributed (ZeRO-1) with model-parallel grad norms."""

from mega_par.optimizer.distrib_optimizer import DistributedOptimizer
from mega_par.optimizer.optimizer import MegatronOptimizer, OptimizerConfig, default_no_weight_decay_cond


def get_megatron_optimizer(config: OptimizerConfig, model_chunks, no_weight_decay_cond=None):
    """Megatron's factory: the distributed optimizer when ``config.use_distributed_optimizer``.

    ``no_weight_decay_cond(name, param) -> bool`` exempts parameters from weight decay; None means Megatron's
    default (biases and 1-D parameters such as norm weights).
    """
    if config.use_distributed_optimizer:
        return DistributedOptimizer(config, model_chunks, no_weight_decay_cond)
    return MegatronOptimizer(config, model_chunks, no_weight_decay_cond)


__all__ = [
    "DistributedOptimizer",
    "MegatronOptimizer",
    "OptimizerConfig",
    "default_no_weight_decay_cond",
    "get_megatron_optimizer",
]
