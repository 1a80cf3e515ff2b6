"""``deepspeed.comm`` (``deepspeed/comm/comm.py``, ``reduce_op.py``, ``utils.py``): ``init_distributed`` joins the job
torchrun (or the environment) describes, with DeepSpeed's defaults; the collectives are torch.distributed's under
DeepSpeed's names and signatures (``import deepspeed.comm as dist``). DeepSpeed's comms logger (``prof=True``,
``log_summary``, ``configure``) is not built: asking for it is refused by name."""

from __future__ import annotations

import datetime
import enum
import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def _default_timeout() -> datetime.timedelta:
    return datetime.timedelta(minutes=int(os.environ.get("DEEPSPEED_TIMEOUT", "30")))  # DeepSpeed's default


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout: datetime.timedelta | None = None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1,
                     world_size: int = -1) -> None:
    """Without the launcher's variables it is one process on this machine (DeepSpeed tries MPI discovery there;
    mpi4py is not used here). ``dist_backend`` defaults to nccl with CUDA, else gloo; ``DEEPSPEED_TIMEOUT``
    (minutes) sets the timeout."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError("torch.distributed is not initialised and dist_init_required=False; call "
                           "dist.init_process_group first")
    if config is not None:  # DeepSpeed reads only its comms-logger section from it; ds-zero has no comms logger
        logger.warning("init_distributed(config=...): DeepSpeed's comms logging is not built in ds_zero; ignored")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout={timeout!r} must be a datetime.timedelta")
    if init_method is None:
        if verbose and "RANK" not in os.environ:
            logger.info("no launcher environment (RANK, WORLD_SIZE, ...): one process on 127.0.0.1:%d",
                        distributed_port)
        for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                             ("MASTER_PORT", str(distributed_port))):
            os.environ.setdefault(key, default)
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs = {"timeout": timeout or _default_timeout(), "init_method": init_method}
    if rank >= 0 or world_size >= 0:  # a tcp:// or file:// init_method needs them
        kwargs.update(rank=rank, world_size=world_size)
    dist.init_process_group(backend, **kwargs)


class ReduceOp(enum.Enum):
    """``deepspeed.comm.ReduceOp``; torch's ``ReduceOp`` is accepted as well."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7
    UNUSED = 8


def _op(op):
    if isinstance(op, ReduceOp):
        if op is ReduceOp.UNUSED:
            raise ValueError("ReduceOp.UNUSED is not a reduction")
        return getattr(dist.ReduceOp, op.name)
    return op


def _no_prof(prof) -> None:
    if prof:
        raise NotImplementedError("prof=True: DeepSpeed's comms logger is not built in ds_zero")


def get_local_rank_from_launcher() -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))


def get_world_rank_from_launcher() -> int:
    return int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))


def get_world_size_from_launcher() -> int:
    return int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", 1)))


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None) -> None:
    if enabled or prof_all or prof_ops:
        raise NotImplementedError("deepspeed.comm.configure: DeepSpeed's comms logger is not built in ds_zero")


def log_summary(show_straggler=False, return_dict=False):
    raise NotImplementedError("deepspeed.comm.log_summary: DeepSpeed's comms logger is not built in ds_zero")


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_available() -> bool:
    return True


def destroy_process_group(group=None) -> None:
    return dist.destroy_process_group(group)


def new_group(ranks):
    return dist.new_group(ranks)


def get_world_group():
    return dist.group.WORLD


def get_world_size(group=None) -> int:
    return dist.get_world_size(group)


def get_rank(group=None) -> int:
    return dist.get_rank(group)


def get_local_rank() -> int:
    if not is_initialized():
        raise RuntimeError("DeepSpeed backend not set, please initialize it using init_process_group()")
    return get_local_rank_from_launcher()


def get_global_rank(group=None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_rank)


def get_all_ranks_from_group(group=None) -> list:
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


def has_reduce_scatter_tensor() -> bool:
    return True


def has_all_gather_into_tensor() -> bool:
    return True


def has_all_reduce_coalesced() -> bool:
    return hasattr(dist, "all_reduce_coalesced")


def has_coalescing_manager() -> bool:
    return hasattr(dist.distributed_c10d, "_coalescing_manager")


def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name="broadcast", debug=None):
    _no_prof(prof)
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(object_list, src, group=None, device=None, prof=False, log_name="broadcast_object_list",
                          debug=None):
    _no_prof(prof)
    return dist.broadcast_object_list(object_list, src, group=group, device=device)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce", debug=None):
    _no_prof(prof)
    return dist.all_reduce(tensor, _op(op), group=group, async_op=async_op)


def inference_all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce",
                         debug=None):
    """DeepSpeed's shared-memory kernel where built; here the process group's all-reduce (same sum), and the same
    return: the tensor itself on one rank, else what ``all_reduce`` returns."""
    _no_prof(prof)
    if dist.get_world_size(group) <= 1:
        return tensor
    return dist.all_reduce(tensor, _op(op), group=group)


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce",
                         debug=None):
    _no_prof(prof)
    return dist.all_reduce_coalesced(tensors, _op(op), group=group, async_op=async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="reduce", debug=None):
    _no_prof(prof)
    return dist.reduce(tensor, dst, _op(op), group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False, log_name="all_gather", debug=None):
    _no_prof(prof)
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list, obj, group=None, prof=False, log_name="all_gather_object", debug=None):
    _no_prof(prof)
    return dist.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False, prof=False,
                           log_name="all_gather_into_tensor", debug=None):
    _no_prof(prof)
    return dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, debug=None):
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def all_gather_coalesced(output_tensors, input_tensors, group=None, async_op=False):
    if len(output_tensors) != len(input_tensors):
        raise ValueError(f"all_gather_coalesced: {len(output_tensors)} outputs for {len(input_tensors)} inputs")
    with dist.distributed_c10d._coalescing_manager(group, async_ops=async_op) as cm:
        for out, inp in zip(output_tensors, input_tensors):
            dist.all_gather_into_tensor(out, inp, group=group)
    return cm if async_op else None


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                   log_name="reduce_scatter", debug=None):
    _no_prof(prof)
    return dist.reduce_scatter(output, input_list, _op(op), group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                          log_name="reduce_scatter_tensor", debug=None):
    _no_prof(prof)
    return dist.reduce_scatter_tensor(output_tensor, tensor, _op(op), group=group, async_op=async_op)


def reduce_scatter_fn(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, debug=None):
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op, prof=prof)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False,
                      prof=False, log_name="all_to_all_single", debug=None):
    _no_prof(prof)
    return dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes, group=group,
                                  async_op=async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, prof=False, log_name="all_to_all",
               debug=None):
    _no_prof(prof)
    return dist.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, prof=False, log_name="gather", debug=None):
    _no_prof(prof)
    return dist.gather(tensor, gather_list, dst, group=group, async_op=async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, prof=False, log_name="scatter", debug=None):
    _no_prof(prof)
    return dist.scatter(tensor, scatter_list, src, group=group, async_op=async_op)


def send(tensor, dst, group=None, tag=0, prof=False, log_name="send", debug=None):
    _no_prof(prof)
    return dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0, prof=False, log_name="recv", debug=None):
    _no_prof(prof)
    return dist.recv(tensor, src, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0, prof=False, log_name="isend", debug=None):
    _no_prof(prof)
    return dist.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0, prof=False, log_name="irecv", debug=None):
    _no_prof(prof)
    return dist.irecv(tensor, src, group=group, tag=tag)


class P2POp:
    """``deepspeed.comm.P2POp``: one ``isend`` / ``irecv`` of a :func:`batch_isend_irecv` batch."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        if op not in (isend, irecv):
            raise ValueError("op must be deepspeed.comm.isend or deepspeed.comm.irecv")
        self.op = "isend" if op is isend else "irecv"
        self.tensor, self.peer, self.group, self.tag = tensor, peer, group, tag


def batch_isend_irecv(p2p_op_list, prof=False, log_name="batch_isend_irecv", debug=None):
    _no_prof(prof)
    return dist.batch_isend_irecv([dist.P2POp(getattr(dist, p.op), p.tensor, p.peer, p.group, p.tag)
                                   for p in p2p_op_list])


def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name="barrier", debug=None):
    _no_prof(prof)
    return dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, prof=False, log_name="monitored_barrier",
                      debug=None):
    _no_prof(prof)
    return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
