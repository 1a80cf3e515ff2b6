"""pt_dist: torch.distributed's c10d layer rebuilt small (stores, ProcessGroup, tcp/shm backends, adapters)."""

from pt_dist.backends import Backend
from pt_dist.batch_p2p import P2POp, batch_isend_irecv
from pt_dist.distributed_c10d import (
    GroupMember,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    destroy_process_group,
    gather,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    recv,
    reduce,
    reduce_scatter_tensor,
    scatter,
    send,
    symmetric_empty,
)
from pt_dist.errors import DistError, DistStoreError
from pt_dist.file_store import FileStore
from pt_dist.list_collectives import all_to_all, reduce_scatter
from pt_dist.monitored_barrier import monitored_barrier
from pt_dist.object_collectives import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from pt_dist.process_group import ProcessGroup, ReduceOp
from pt_dist.store import HashStore, PrefixStore, Store, TCPStore
from pt_dist.subgroups import new_group, new_subgroups, new_subgroups_by_enumeration
from pt_dist.work import Work

__version__ = "0.1.0"

__all__ = [
    "Backend", "DistError", "DistStoreError", "FileStore", "GroupMember", "HashStore", "P2POp", "PrefixStore",
    "ProcessGroup", "ReduceOp", "Store", "TCPStore", "Work", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_reduce", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "broadcast", "broadcast_object_list", "destroy_process_group", "gather", "gather_object", "get_backend",
    "get_global_rank", "get_group_rank", "get_node_local_rank", "get_process_group_ranks", "get_rank",
    "get_world_size", "init_process_group", "irecv", "is_available", "is_initialized", "isend",
    "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv",
    "recv_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "send", "send_object_list", "symmetric_empty",
]
