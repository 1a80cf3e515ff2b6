"""ds-zero's launcher, DeepSpeed's ``deepspeed`` command (``deepspeed/launcher/``) as ``ds-zero``; it lives in
:mod:`ds_zero._compat.launcher`."""

from ds_zero._compat.launcher.hostfile import (
    apply_num_nodes_and_gpus,
    fetch_hostfile,
    parse_hostfile,
    parse_inclusion_exclusion,
    parse_resource_filter,
)

__all__ = ["fetch_hostfile", "parse_hostfile", "parse_resource_filter", "parse_inclusion_exclusion",
           "apply_num_nodes_and_gpus"]
