# pt-dist drop-in >>>
# Upstream: pytorch/examples distributed/FSDP2/utils.py at commit
#           77f55b912142e11fcfdf5b530231fb9c52f181e8 (last changed in 5a4ca92). model.py next to this file is upstream's
#           byte for byte (tests/test_examples_fsdp2.py checks the four files' sha256).
# Changed lines (the whole diff; tests/test_examples_fsdp2.py swaps them back, checks upstream's sha256 and runs
# both):
#   imports only: torch.distributed.fsdp and torch.distributed.tensor -> pt_dist.fsdp,
#   pt_dist.tensor
# Run: torchrun --standalone --nproc-per-node 2 example.py [--explicit-prefetching] [--mixed-precision]
#      [--dcp-api]   (a second run resumes from ./checkpoints)
# pt-dist drop-in <<<
import torch
from model import Transformer
from pt_dist.fsdp import FSDPModule
from pt_dist.tensor import Shard


def inspect_model(model: FSDPModule):
    assert isinstance(model, Transformer)
    assert isinstance(model, FSDPModule)

    if torch.distributed.get_rank() == 0:
        print(model)

    for param in model.parameters():
        assert param.placements == (Shard(0),)
        assert param.dtype == torch.float32
        # print(param.get_local_tensor())


def inspect_mixed_precision(model: FSDPModule):
    model.unshard()
    for param in model.parameters(recurse=False):
        assert param.dtype == torch.bfloat16
    model.reshard()
