#!/usr/bin/env python
# ds-zero drop-in >>>
# Upstream: deepspeedai/DeepSpeed docs/_tutorials/zero.md at commit fd405169232dd83bdc7883df1c7d707d482e1be6
#           ("Allocating Massive Megatron-LM Models": zero.Init and GatheredParameters; the ZeRO-Infinity JSON in
#           zero3_config.json). The page is snippets of Megatron-LM's GPT-2: the lines between "# page >>>" and
#           "# page <<<" are them as printed (`torch.nn.Embedding(...)` given its sizes); the small model, `mpu`,
#           `get_args()` and the training loop around them are this file's. zero3_config.json is the page's
#           ZeRO-Infinity "zero_optimization" block as printed, with a batch size and an optimizer added.
# Changed lines (the whole diff; tests/test_examples.py swaps it back and runs both):
#   import deepspeed -> import ds_zero as deepspeed
# CUDA-only lines: none.
# Run: torchrun --nproc-per-node 2 zero3_init.py --deepspeed_config zero3_config.json --remote_device cpu
# ds-zero drop-in <<<
import argparse
import os

import torch
import torch.distributed as dist

import ds_zero as deepspeed

VOCAB, SEQ, HIDDEN, TOKEN_TYPES = 64, 16, 32, 2


def get_args():
    parser = argparse.ArgumentParser(description="ZeRO-3 model construction, as the ZeRO tutorial shows it")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--remote_device", default="none", choices=["none", "cpu"])
    parser.add_argument("--zero_stage", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_known_args()[0]


class DataParallelMpu:
    """The one data-parallel group the tutorial's `mpu` stands for here (no model parallelism)."""

    def get_data_parallel_group(self):
        return dist.group.WORLD


mpu = DataParallelMpu()


class GPT2Model(torch.nn.Module):
    """Word, position and token-type embeddings and an LM head, initialised as Megatron's embedding is."""

    def __init__(self, num_tokentypes=0, parallel_output=True):
        super().__init__()
        self.init_method = lambda w: torch.nn.init.normal_(w, std=0.02)
        self.word_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        # page >>>
        self.position_embeddings = torch.nn.Embedding(SEQ, HIDDEN)
        with deepspeed.zero.GatheredParameters(self.position_embeddings.weight,
                                               modifier_rank=0):
            # Initialize the position embeddings.
            self.init_method(self.position_embeddings.weight)

        ...

        self.tokentype_embeddings = torch.nn.Embedding(TOKEN_TYPES, HIDDEN)
        with deepspeed.zero.GatheredParameters(self.tokentype_embeddings.weight,
                                            modifier_rank=0):
            # Initialize the token-type embeddings.
            self.init_method(self.tokentype_embeddings.weight)
        # page <<<
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(),
                                       torch.nn.Linear(4 * HIDDEN, HIDDEN))
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens, types):
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        h = self.word_embeddings(tokens) + self.position_embeddings(positions) + self.tokentype_embeddings(types)
        return self.head(h + self.mlp(h))


def main():
    deepspeed.init_distributed()
    torch.manual_seed(0)  # the same random draws on every rank; modifier_rank=0's values win anyway
    # page >>>
    with deepspeed.zero.Init(data_parallel_group=mpu.get_data_parallel_group(),
                             remote_device=get_args().remote_device,
                             enabled=get_args().zero_stage==3):
        model = GPT2Model(num_tokentypes=0, parallel_output=True)
    # page <<<
    args = get_args()
    report_position_embeddings(model, "initialised")
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for step in range(args.steps):
        tokens = torch.randint(0, VOCAB, (engine.train_micro_batch_size_per_gpu(), SEQ), generator=g)
        types = torch.randint(0, TOKEN_TYPES, tokens.shape, generator=g)
        logits = engine(tokens, types)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if dist.get_rank() == 0:
            print(f"step {step} loss {total.item() / dist.get_world_size():.8f}", flush=True)
    report_position_embeddings(model, "trained")


def report_position_embeddings(model, when):
    with deepspeed.zero.GatheredParameters(model.position_embeddings.weight):
        if dist.get_rank() == 0:
            total = model.position_embeddings.weight.double().sum().item()
            print(f"position_embeddings {when} {total:.8f}", flush=True)


if __name__ == "__main__":
    main()
