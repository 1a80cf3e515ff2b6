"""torch's FSDP1 API around pt_dist's core FullyShardedDataParallel (pt_dist/fsdp/): the class users import,
``use_orig_params``, ``state_dict_type``, ``summon_full_params`` and optimizer state dicts. Imported through the
facades pt_dist.fsdp, pt_dist.fsdp.fully_sharded_data_parallel and pt_dist.fsdp.api."""

from pt_dist._compat.fsdp import tensor_parallel  # noqa: F401  (registers FSDP2's FSDPParam for TP parameters)
