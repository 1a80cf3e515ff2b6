"""Optimizers over mega_par's grad buffers: plain and distributed (ZeRO-1) with model-parallel grad norms."""

from mega_par.optimizer.distrib_optimizer import DistributedOptimizer
from mega_par.optimizer.optimizer import MegatronOptimizer, OptimizerConfig


def get_megatron_optimizer(config: OptimizerConfig, model_chunks):
    """Megatron's factory: the distributed optimizer when ``config.use_distributed_optimizer``."""
    if config.use_distributed_optimizer:
        return DistributedOptimizer(config, model_chunks)
    return MegatronOptimizer(config, model_chunks)


__all__ = ["DistributedOptimizer", "MegatronOptimizer", "OptimizerConfig", "get_megatron_optimizer"]
