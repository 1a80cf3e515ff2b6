"""torch's library of DDP communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``), over the core's
``DistributedDataParallel.register_comm_hook`` and ``GradBucket``."""
