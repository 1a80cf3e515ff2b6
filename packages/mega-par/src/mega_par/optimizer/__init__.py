"""Optimizers over mega_par's grad buffers: plain and distributed (ZeRO-1) with model-parallel grad norms."""

from mega_par.optimizer.distrib_optimizer import DistributedOptimizer
from mega_par.optimizer.factory import get_megatron_optimizer
from mega_par.optimizer.optimizer import MegatronOptimizer, OptimizerConfig, default_no_weight_decay_cond

__all__ = [
    "DistributedOptimizer",
    "MegatronOptimizer",
    "OptimizerConfig",
    "default_no_weight_decay_cond",
    "get_megatron_optimizer",
]
