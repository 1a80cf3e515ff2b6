"""pt_dist: torch.distributed rebuilt small (c10d, DDP, FSDP, DTensor, DCP, RPC); this module is its facade.

The core sits at torch's file names, ``_compat/`` holds what exists only so torch's code runs, ``_infra/`` the
hardening (stores, auth, failure detection); see the README's reading guides."""

from torch.distributed import is_gloo_available, is_mpi_available, is_nccl_available  # what torch was built with

from pt_dist import autograd, rpc  # attributes after ``import pt_dist``, as torch.distributed's
from pt_dist._compat import torch_adapter as torch_adapter  # registers torch's gloo, nccl, mpi
from pt_dist._compat import torch_backend as torch_backend  # makes ours torch backends: pt_tcp, pt_shm
from pt_dist._compat.batch_p2p import P2POp, batch_isend_irecv
from pt_dist._compat.list_collectives import (
    all_gather_coalesced,
    all_gather_single,
    all_reduce_coalesced,
    all_to_all,
    gather_into_tensor,
    gather_single,
    reduce_scatter,
    reduce_scatter_single,
)
from pt_dist._compat.monitored_barrier import monitored_barrier
from pt_dist._compat.subgroups import new_subgroups, new_subgroups_by_enumeration, split_group
from pt_dist._infra.errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from pt_dist._infra.file_store import FileStore
from pt_dist._infra.hash_store import HashStore
from pt_dist._infra.store import PrefixStore, Store, TCPStore
from pt_dist.backends import Backend, get_default_backend_for_device, is_backend_available
from pt_dist.distributed_c10d import (
    GroupMember,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    default_pg_timeout,
    destroy_process_group,
    gather,
    get_backend,
    get_backend_config,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    is_torchelastic_launched,
    isend,
    recv,
    reduce,
    reduce_scatter_tensor,
    scatter,
    send,
    set_timeout,
    symmetric_empty,
)
from pt_dist.fsdp import FullyShardedDataParallel
from pt_dist.nn.parallel import DistributedDataParallel, GradBucket
from pt_dist.object_collectives import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from pt_dist.process_group import ProcessGroup, ReduceOp, supports_complex
from pt_dist.subgroups import new_group
from pt_dist.utils import _broadcast_coalesced as _broadcast_coalesced  # torch.distributed's (private there too)
from pt_dist.work import Work

__version__ = "0.1.0"

__all__ = [
    "Backend", "DistBackendError", "DistError", "DistNetworkError", "DistStoreError", "DistributedDataParallel",
    "FileStore", "FullyShardedDataParallel", "GradBucket", "GroupMember", "HashStore", "P2POp", "PrefixStore",
    "ProcessGroup", "ReduceOp", "Store", "TCPStore", "Work", "all_gather", "all_gather_coalesced",
    "all_gather_into_tensor", "all_gather_object", "all_gather_single", "all_reduce", "all_reduce_coalesced",
    "all_to_all", "all_to_all_single", "autograd", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "default_pg_timeout", "destroy_process_group", "gather", "gather_into_tensor", "gather_object", "gather_single",
    "get_backend", "get_backend_config", "get_default_backend_for_device", "get_global_rank", "get_group_rank",
    "get_node_local_rank", "get_pg_count", "get_process_group_ranks", "get_rank", "get_world_size", "group",
    "init_process_group", "irecv", "is_available", "is_backend_available", "is_gloo_available", "is_initialized",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "isend", "monitored_barrier", "new_group",
    "new_subgroups", "new_subgroups_by_enumeration", "recv", "recv_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "rpc", "scatter", "scatter_object_list", "send",
    "send_object_list", "set_timeout", "split_group", "supports_complex", "symmetric_empty",
]
