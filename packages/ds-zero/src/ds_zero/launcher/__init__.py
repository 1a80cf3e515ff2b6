"""ds-zero's launcher, DeepSpeed's ``deepspeed`` command (``deepspeed/launcher/``) as ``ds-zero``.

``hostfile`` reads the resource pool and its filters, ``runner`` is the command line,
``launch`` one node's torchrun, ``local_rank`` the per-rank step that passes ``--local_rank``.
"""

from ds_zero.launcher.hostfile import (
    apply_num_nodes_and_gpus,
    fetch_hostfile,
    parse_hostfile,
    parse_inclusion_exclusion,
    parse_resource_filter,
)

__all__ = ["fetch_hostfile", "parse_hostfile", "parse_resource_filter", "parse_inclusion_exclusion",
           "apply_num_nodes_and_gpus"]
