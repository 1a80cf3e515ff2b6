"""The multiprocessing executor (vLLM ``executor/multiproc_executor.py``; v0 ``multiproc_gpu_executor.py``).

Rank 0's ``Worker`` runs in the engine's process (the driver); ``tensor_parallel_size - 1`` spawned processes run
``worker_main``: the same ``Worker``, then a loop that receives each step's ``ExecuteModelRequest`` from the
driver's broadcast and runs it, until the driver broadcasts ``None``. The scheduler runs once, on the driver; a
step costs one broadcast of its metadata plus the collectives inside the forward pass, and the logits are gathered
on the driver, where the sampler runs. With one rank there are no processes and every collective is the identity.
The processes are supervised by ``_infra/worker_procs.py``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from paged_serve._infra.worker_procs import WorkerProcs, get_open_port
from paged_serve.config import VllmConfig
from paged_serve.distributed.parallel_state import destroy_model_parallel
from paged_serve.worker.worker import ExecuteModelRequest, Worker

logger = logging.getLogger(__name__)


def _start(worker: Worker) -> Worker:
    worker.init_device()
    worker.load_model()
    worker.initialize_cache()
    return worker


def worker_main(vllm_config: VllmConfig, rank: int, distributed_init_method: str) -> None:
    """A worker process: build rank ``rank``'s ``Worker`` and run the driver's steps until it says stop."""
    worker = _start(Worker(vllm_config, rank, distributed_init_method))
    while (request := worker.tp_group.broadcast_tensor_dict()) is not None:
        worker.execute_model(request)
    destroy_model_parallel()


class MultiprocExecutor:
    def __init__(self, vllm_config: VllmConfig):
        world_size = vllm_config.parallel_config.world_size
        init_method = f"tcp://127.0.0.1:{get_open_port()}" if world_size > 1 else None
        self.workers = WorkerProcs(worker_main, [(vllm_config, rank, init_method) for rank in range(1, world_size)])
        self.failed, self.num_threads = False, torch.get_num_threads()  # a CPU driver worker takes its share
        try:
            self.driver_worker = _start(Worker(vllm_config, 0, init_method))
        except BaseException:
            self.failed = True
            self.shutdown()
            raise

    def execute_model(self, request: ExecuteModelRequest) -> torch.Tensor | None:
        """Run one step on every rank; the logits of the sampled (and prompt-scored) rows, on the driver."""
        if self.failed and self.workers.procs:  # the ranks may be mid-collective: vLLM's engine is dead now too
            self.workers.check()
            raise RuntimeError("an earlier step failed on the tensor-parallel ranks: the engine must be rebuilt")
        try:
            self.workers.check()
            shared = request  # the workers need the tensors only, not the driver's sequence objects
            if request.model_input is not None:
                model_input = dataclasses.replace(request.model_input, sampled_seqs=[], prompt_rows=None)
                shared = dataclasses.replace(request, model_input=model_input)
            self.driver_worker.tp_group.broadcast_tensor_dict(shared)
            return self.driver_worker.execute_model(request)
        except Exception:
            self.failed = True
            self.workers.check(wait=2.0)  # a dead worker is the cause: say which
            raise

    def shutdown(self) -> None:
        """Stop the workers (a ``None`` step, then whatever is left is terminated) and leave the group."""
        if self.workers.procs and not self.failed:
            try:
                self.driver_worker.tp_group.broadcast_tensor_dict(None)
            except Exception:  # noqa: BLE001 - a worker already gone: stop() below ends the rest
                logger.warning("a worker did not receive the stop step")
        self.workers.stop(timeout=10.0 if not self.failed else 0.0)
        if self.workers.procs:
            destroy_model_parallel()
            torch.set_num_threads(self.num_threads)
        self.workers.procs = []
