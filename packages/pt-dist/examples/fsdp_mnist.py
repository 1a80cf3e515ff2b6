# pt-dist drop-in >>>
# Upstream: pytorch/tutorials intermediate_source/FSDP_tutorial.rst at commit
#           c53e7d4efc0e39e455c531d21ec7db28ba220214 ("Getting Started with Fully Sharded Data Parallel(FSDP)", the
#           FSDP1 page). The page is snippets of one script, "FSDP_mnist.py": the body below is its seven
#           `.. code-block:: python` blocks of sections 1.2-2.5, in order, each dedented by 4 spaces, separated by
#           two blank lines (sha256 a5f5210c9664cad6b08a6e4dd0e9f5cac6e21bf0819c0e85c170375218906f11, which
#           tests/test_examples.py checks after swapping the lines below back). The page's later variants of
#           2.4 (auto_wrap_policy, CPUOffload, DDP) are not in the file.
# Changed lines (the whole diff):
#   imports:
#     import torch.distributed as dist -> import pt_dist as dist
#     from torch.nn.parallel import DistributedDataParallel as DDP -> from pt_dist.nn.parallel import ...
#     from torch.distributed.fsdp import FullyShardedDataParallel as FSDP -> from pt_dist.fsdp import ...
#     from torch.distributed.fsdp.fully_sharded_data_parallel import ( -> from pt_dist.fsdp.fully_sharded_data_parallel import (
#     from torch.distributed.fsdp.wrap import ( -> from pt_dist.fsdp.wrap import (
#   CUDA-only (CPU ranks, gloo):
#     dist.init_process_group("nccl", ...)         -> dist.init_process_group("gloo", ...)
#     torch.cuda.set_device(rank)                   -> commented out
#     init_start_event.record(), init_end_event.record() and the "CUDA event elapsed time" print -> commented
#       out (torch.cuda.Event is built lazily, but record() needs a driver; the time is not compared anyway)
#     Net().to(rank), torch.zeros(2).to(rank), torch.zeros(3).to(rank), data.to(rank), target.to(rank) (twice)
#                                                   -> .to("cpu")
#     WORLD_SIZE = torch.cuda.device_count()        -> WORLD_SIZE = 2
#     model = FSDP(model)                           -> FSDP(model, device_id=torch.device("cpu")) (torch's FSDP1
#       raises "FSDP needs a non-CPU accelerator device" without it; pt_dist's accepts either)
#   data: the MNIST download, datasets.MNIST('../data', train=True, download=True, / ('../data', train=False,
#     -> a small local stand-in of MNIST's shape, datasets.FakeData(size=128 / 64, image_size=(1, 28, 28),
#     num_classes=10, random_offset=128 for the test split: random images and labels, fixed per index), the
#     same transform= line after it.
#     train_kwargs.update(cuda_kwargs), test_kwargs.update(cuda_kwargs) -> commented out: the script's own
#       "cuda_kwargs" (num_workers=2, pin_memory=True, shuffle=False), which pytorch/examples' mnist/main.py, the
#       page's base, applies only `if use_cuda`. Under mp.spawn a DataLoader's workers are spawned too, so every
#       epoch starts 4 fresh interpreters per rank that import torch again: one epoch of 256 images took 2 min 42 s
#       on the 2-core test machine with them, about 10 s without. shuffle=False is DataLoader's default anyway.
# Kept as upstream: MASTER_PORT 12355 (so one run at a time on a host), mp.spawn (no torchrun).
# Run: python fsdp_mnist.py --epochs 2 --batch-size 32 --test-batch-size 64 --save-model
# pt-dist drop-in <<<
# Based on: https://github.com/pytorch/examples/blob/master/mnist/main.py
import os
import argparse
import functools
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torchvision import datasets, transforms


from torch.optim.lr_scheduler import StepLR

import pt_dist as dist
import torch.multiprocessing as mp
from pt_dist.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp.fully_sharded_data_parallel import (
    CPUOffload,
    BackwardPrefetch,
)
from pt_dist.fsdp.wrap import (
    size_based_auto_wrap_policy,
    enable_wrap,
    wrap,
)


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

def cleanup():
    dist.destroy_process_group()


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
    
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=None):
    model.train()
    ddp_loss = torch.zeros(2).to("cpu")
    if sampler:
        sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to("cpu"), target.to("cpu")
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target, reduction='sum')
        loss.backward()
        optimizer.step()
        ddp_loss[0] += loss.item()
        ddp_loss[1] += len(data)

    dist.all_reduce(ddp_loss, op=dist.ReduceOp.SUM)
    if rank == 0:
        print('Train Epoch: {} \tLoss: {:.6f}'.format(epoch, ddp_loss[0] / ddp_loss[1]))


def test(model, rank, world_size, test_loader):
    model.eval()
    correct = 0
    ddp_loss = torch.zeros(3).to("cpu")
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to("cpu"), target.to("cpu")
            output = model(data)
            ddp_loss[0] += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            ddp_loss[1] += pred.eq(target.view_as(pred)).sum().item()
            ddp_loss[2] += len(data)

    dist.all_reduce(ddp_loss, op=dist.ReduceOp.SUM)

    if rank == 0:
        test_loss = ddp_loss[0] / ddp_loss[2]
        print('Test set: Average loss: {:.4f}, Accuracy: {}/{} ({:.2f}%)\n'.format(
            test_loss, int(ddp_loss[1]), int(ddp_loss[2]),
            100. * ddp_loss[1] / ddp_loss[2]))


def fsdp_main(rank, world_size, args):
    setup(rank, world_size)

    transform=transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize((0.1307,), (0.3081,))
    ])

    dataset1 = datasets.FakeData(size=128, image_size=(1, 28, 28), num_classes=10,
                        transform=transform)
    dataset2 = datasets.FakeData(size=64, image_size=(1, 28, 28), num_classes=10, random_offset=128,
                        transform=transform)

    sampler1 = DistributedSampler(dataset1, rank=rank, num_replicas=world_size, shuffle=True)
    sampler2 = DistributedSampler(dataset2, rank=rank, num_replicas=world_size)

    train_kwargs = {'batch_size': args.batch_size, 'sampler': sampler1}
    test_kwargs = {'batch_size': args.test_batch_size, 'sampler': sampler2}
    cuda_kwargs = {'num_workers': 2,
                    'pin_memory': True,
                    'shuffle': False}
    # train_kwargs.update(cuda_kwargs)
    # test_kwargs.update(cuda_kwargs)

    train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)
    my_auto_wrap_policy = functools.partial(
        size_based_auto_wrap_policy, min_num_params=100
    )
    # torch.cuda.set_device(rank)
    
    
    init_start_event = torch.cuda.Event(enable_timing=True)
    init_end_event = torch.cuda.Event(enable_timing=True)

    model = Net().to("cpu")

    model = FSDP(model, device_id=torch.device("cpu"))

    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    # init_start_event.record()
    for epoch in range(1, args.epochs + 1):
        train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=sampler1)
        test(model, rank, world_size, test_loader)
        scheduler.step()

    # init_end_event.record()

    if rank == 0:
        # print(f"CUDA event elapsed time: {init_start_event.elapsed_time(init_end_event) / 1000}sec")
        print(f"{model}")

    if args.save_model:
        # use a barrier to make sure training is done on all ranks
        dist.barrier()
        states = model.state_dict()
        if rank == 0:
            torch.save(states, "mnist_cnn.pt")
    
    cleanup()


if __name__ == '__main__':
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=10, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--save-model', action='store_true', default=False,
                        help='For Saving the current Model')
    args = parser.parse_args()

    torch.manual_seed(args.seed)

    WORLD_SIZE = 2
    mp.spawn(fsdp_main,
        args=(WORLD_SIZE, args),
        nprocs=WORLD_SIZE,
        join=True)
