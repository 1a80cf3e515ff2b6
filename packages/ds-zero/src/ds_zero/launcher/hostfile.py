"""``deepspeed/launcher/runner.py``'s resource-pool functions; they live in :mod:`ds_zero._compat.launcher.hostfile`."""

from ds_zero._compat.launcher.hostfile import (
    NODE_SEP,
    SLOT_LIST_START,
    SLOT_SEP,
    apply_num_nodes_and_gpus,
    fetch_hostfile,
    parse_hostfile,
    parse_inclusion_exclusion,
    parse_node_config,
    parse_node_config_list,
    parse_resource_filter,
)

__all__ = ["NODE_SEP", "SLOT_LIST_START", "SLOT_SEP", "apply_num_nodes_and_gpus", "fetch_hostfile", "parse_hostfile",
           "parse_inclusion_exclusion", "parse_node_config", "parse_node_config_list", "parse_resource_filter"]
