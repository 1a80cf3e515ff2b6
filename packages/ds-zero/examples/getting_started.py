#!/usr/bin/env python
# ds-zero drop-in >>>
# Upstream: deepspeedai/DeepSpeed docs/_tutorials/getting-started.md at commit
#           461d641f00a04e96f2d3c58af55ff6af4b50fc92 ("Writing DeepSpeed Models", "Training", "Model
#           Checkpointing", "DeepSpeed Configuration"). The page is snippets, not a script: the lines between
#           "# page >>>" and "# page <<<" are its snippets as printed, in its order; the model, the data, the
#           argument parser and `dataloader_to_step` around them are this file's (the page leaves them to the
#           reader). ds_config.json next to this file is the page's sample config.
# Changed lines (the whole diff; tests/test_examples.py swaps it back and runs both):
#   import deepspeed -> import ds_zero as deepspeed
# Not from the page: `save_checkpoint(..., client_sd = client_sd)` is a TypeError in DeepSpeed itself (the keyword
#   is client_state), so the snippet is used with client_state=; the page's `if step % args.save_interval:`
#   saves on the steps that are *not* multiples of the interval, kept as printed. The page's tag is each rank's
#   own loss, so with several ranks they save under different tags and DeepSpeed cannot load its own
#   checkpoint (rank 1 finds no files under rank 0's `latest`): the page's recipe holds for one process.
# CUDA-only lines: none (the page's config has "fp16": {"enabled": true}; on CPU run it with fp16 off, as the
#   test does: DeepSpeed's CPU accelerator has no fp16 training either).
# Run: python getting_started.py --deepspeed --deepspeed_config ds_config.json
#      --save_dir ckpt --steps 5, then the same with --load_dir ckpt (the latest tag) to resume.
# ds-zero drop-in <<<
import argparse
import os

import torch

import ds_zero as deepspeed


class Regression(torch.nn.Module):
    """The page's `model_engine(batch)` returns the loss: a small MLP that scores itself on (x, y)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)


def get_args():
    parser = argparse.ArgumentParser(description="DeepSpeed getting-started, as a script")
    parser.add_argument("--local_rank", type=int, default=-1, help="passed by the deepspeed launcher")
    parser.add_argument("--steps", type=int, default=10, help="train on the first STEPS batches (no --load_dir)")
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--load_dir", default=None)
    parser.add_argument("--ckpt_id", default=None)
    parser.add_argument("--save_interval", type=int, default=3)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


BATCHES = 10  # per rank


def make_data_loader(batch_size, rank, world):
    """This rank's BATCHES micro-batches of a fixed random regression set."""
    g = torch.Generator().manual_seed(1)
    n = BATCHES * batch_size
    x, y = torch.randn(n * world, 16, generator=g), torch.randn(n * world, 1, generator=g)
    shard = slice(rank * n, (rank + 1) * n)
    return list(torch.utils.data.DataLoader(list(zip(x[shard], y[shard])), batch_size=batch_size))


def dataloader_to_step(data_loader, step):
    del data_loader[:step]


def main():
    cmd_args = get_args()
    args = cmd_args
    torch.manual_seed(0)
    model = Regression()
    params = model.parameters()
    # page >>>
    model_engine, optimizer, _, _ = deepspeed.initialize(args=cmd_args,
                                                         model=model,
                                                         model_parameters=params)
    # page <<<
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    data_loader = make_data_loader(model_engine.train_micro_batch_size_per_gpu(), rank, world)
    client_sd = {"step": -1}
    if args.load_dir is None:
        data_loader = data_loader[:args.steps]
        # page >>>
        for step, batch in enumerate(data_loader):
            #forward() method
            loss = model_engine(batch)

            #runs backpropagation
            model_engine.backward(loss)

            #weight update
            model_engine.step()
            # page <<<
            report(model_engine, step, loss)
            if args.save_dir is not None and step % args.save_interval:
                client_sd['step'] = step
                ckpt_id = loss.item()
                model_engine.save_checkpoint(args.save_dir, ckpt_id, client_state=client_sd)
        return
    # page >>>
    #load checkpoint
    _, client_sd = model_engine.load_checkpoint(args.load_dir, args.ckpt_id)
    step = client_sd['step']

    #advance data loader to ckpt step
    dataloader_to_step(data_loader, step + 1)

    for step, batch in enumerate(data_loader):

        #forward() method
        loss = model_engine(batch)

        #runs backpropagation
        model_engine.backward(loss)

        #weight update
        model_engine.step()
        # page <<<
        report(model_engine, step, loss)


def report(model_engine, step, loss):
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"step {step} loss {loss.item():.8f} global_steps {model_engine.global_steps}", flush=True)


if __name__ == "__main__":
    main()
