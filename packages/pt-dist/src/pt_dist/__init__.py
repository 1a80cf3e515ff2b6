"""pt_dist: torch.distributed's c10d layer rebuilt small (stores, ProcessGroup, tcp/shm backends, adapters)."""

from pt_dist.backends import Backend
from pt_dist.distributed_c10d import (
    GroupMember,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    irecv,
    is_initialized,
    isend,
    new_group,
    recv,
    reduce,
    reduce_scatter_tensor,
    send,
    symmetric_empty,
)
from pt_dist.errors import DistError, DistStoreError
from pt_dist.file_store import FileStore
from pt_dist.process_group import ProcessGroup, ReduceOp
from pt_dist.store import PrefixStore, Store, TCPStore
from pt_dist.work import Work

__version__ = "0.1.0"

__all__ = [
    "Backend", "DistError", "DistStoreError", "FileStore", "GroupMember", "PrefixStore", "ProcessGroup",
    "ReduceOp", "Store", "TCPStore", "Work", "all_gather", "all_gather_into_tensor", "all_reduce",
    "all_to_all_single", "barrier", "broadcast", "destroy_process_group", "get_backend", "get_global_rank",
    "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size", "init_process_group", "irecv",
    "is_initialized", "isend", "new_group", "recv", "reduce", "reduce_scatter_tensor", "send",
    "symmetric_empty",
]
