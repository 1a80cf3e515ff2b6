"""3D-parallel GPT pre-training: ``pretrain(TrainingArgs)`` and the ``mega-par-train`` CLI (``megatron/training``).

Run under torchrun (or any launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)::

    torchrun --nproc-per-node 8 -m mega_par.training --tp 2 --pp 2 --dp 2 --train-iters 5

The world size must equal ``tp * pp * dp``. Data is a deterministic, learnable synthetic stream
(seeded counting sequences) or a flat binary file of uint16 token ids (``--data-path``).
Each step takes a global batch of
``micro_batch_size * num_microbatches * dp`` sequences; DP rank d reads its contiguous slice, cut into
micro-batches that flow through the pipeline schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from mega_par import parallel_state as ps
from mega_par.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
from mega_par.optimizer import OptimizerConfig, get_megatron_optimizer
from mega_par.pipeline_parallel.schedules import get_forward_backward_func
from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
from mega_par.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)


@dataclass
class TrainingArgs:
    tp: int = 1
    pp: int = 1
    dp: int | None = None  # None: whatever the world size leaves; if given, checked against it
    vpp: int | None = None
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int = 128
    seq_length: int = 32
    normalization: str = "RMSNorm"
    position_embedding_type: str = "rope"
    swiglu: bool = True
    add_bias_linear: bool = False
    untie_embeddings_and_output_weights: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    bucket_size: int | None = None
    micro_batch_size: int = 2
    num_microbatches: int = 2
    train_iters: int = 5
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_grad: float = 0.0
    seed: int = 1234
    data_path: str | None = None
    save: str | None = None
    load: str | None = None  # resume from the latest checkpoint there (model, optimizer shard, iteration)
    save_interval: int | None = None
    progress: bool = False

    def transformer_config(self) -> TransformerConfig:
        return TransformerConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups, ffn_hidden_size=self.ffn_hidden_size,
            hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
            normalization=self.normalization, add_bias_linear=self.add_bias_linear,
            gated_linear_unit=self.swiglu, activation_func=torch.nn.functional.silu if self.swiglu
            else torch.nn.functional.gelu, sequence_parallel=self.sequence_parallel,
            tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
            virtual_pipeline_model_parallel_size=self.vpp, pipeline_dtype=torch.float32,
            # as Megatron's training: free sent stage outputs, and the schedule finalises the gradients
            deallocate_pipeline_outputs=True, finalize_model_grads_func=finalize_model_grads)


def _check_args(args: TrainingArgs, world_size: int) -> None:
    """Every bad value is reported before any collective runs."""
    for name in ("tp", "pp", "micro_batch_size", "num_microbatches", "train_iters", "seq_length", "vocab_size"):
        v = getattr(args, name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if world_size % (args.tp * args.pp):
        raise ValueError(f"world size ({world_size}) is not divisible by tp ({args.tp}) x pp ({args.pp})")
    if args.dp is not None and args.tp * args.pp * args.dp != world_size:
        raise ValueError(f"tp ({args.tp}) x pp ({args.pp}) x dp ({args.dp}) = {args.tp * args.pp * args.dp} "
                         f"does not match the world size ({world_size})")
    if args.sequence_parallel and args.seq_length % args.tp:
        raise ValueError(f"seq_length ({args.seq_length}) must be divisible by tp ({args.tp}) with sequence_parallel")
    if args.vpp is not None and args.num_microbatches % args.pp:
        raise ValueError(f"the interleaved schedule needs num_microbatches ({args.num_microbatches}) divisible by "
                         f"pp ({args.pp})")
    args.transformer_config()  # validates the model shape


def build_model(args: TrainingArgs, config: TransformerConfig) -> list:
    """One GPTModel chunk per virtual stage, each wrapped in DDP (Megatron's ``get_model``)."""
    chunks = []
    for v in range(args.vpp or 1):
        if args.vpp:
            ps.set_virtual_pipeline_model_parallel_rank(v)
        model = GPTModel(config, get_gpt_layer_local_spec(), args.vocab_size, args.seq_length,
                         pre_process=ps.is_pipeline_first_stage(),
                         post_process=ps.is_pipeline_last_stage(),
                         share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                         position_embedding_type=args.position_embedding_type, seed=args.seed)
        ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=args.overlap_grad_reduce,
                                                   use_distributed_optimizer=args.use_distributed_optimizer,
                                                   bucket_size=args.bucket_size)
        chunks.append(DistributedDataParallel(config, ddp_config, model))
    if args.vpp:
        ps.set_virtual_pipeline_model_parallel_rank(0)
    return chunks


def global_batch(args: TrainingArgs, iteration: int, dp: int) -> torch.Tensor:
    """Token ids ``[dp * num_microbatches * micro_batch_size, seq_length + 1]`` for one step, identical on all ranks."""
    rows = dp * args.num_microbatches * args.micro_batch_size
    n = args.seq_length + 1
    if args.data_path:
        data = torch.frombuffer(bytearray(open(args.data_path, "rb").read()), dtype=torch.int16).to(torch.int64)
        data = data & 0xFFFF
        if data.numel() < n:
            raise ValueError(f"{args.data_path} holds {data.numel()} tokens, fewer than seq_length + 1 = {n}")
        gen = torch.Generator().manual_seed(args.seed * 1000003 + iteration)
        starts = torch.randint(0, data.numel() - n + 1, (rows,), generator=gen)
        return torch.stack([data[s:s + n] for s in starts.tolist()]) % args.vocab_size
    # learnable synthetic text: each row counts from a random start with a random stride (1..3)
    gen = torch.Generator().manual_seed(args.seed * 1000003 + iteration)
    start = torch.randint(0, args.vocab_size, (rows, 1), generator=gen)
    stride = torch.randint(1, 4, (rows, 1), generator=gen)
    return (start + stride * torch.arange(n)) % args.vocab_size


def microbatches(args: TrainingArgs, tokens: torch.Tensor, dp_rank: int) -> list[dict]:
    per_rank = args.num_microbatches * args.micro_batch_size
    mine = tokens[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    return [{"tokens": mb[:, :-1].contiguous(), "labels": mb[:, 1:].contiguous()}
            for mb in mine.split(args.micro_batch_size)]


def forward_step(data_iterator, model):
    """Megatron's GPT ``forward_step``: run the stage, return the loss function for the last stage."""
    batch = next(data_iterator)
    output = model(batch["tokens"], None, None, labels=batch["labels"])

    def loss_func(output_tensor):
        loss = output_tensor.float().mean()
        return loss, {"lm loss": loss.detach()}

    return output, loss_func


def _step_loss(losses_reduced, pp_last_rank) -> float:
    """Mean micro-batch loss, averaged over DP and shared with every stage of the pipeline."""
    value = torch.zeros(1)
    if ps.is_pipeline_last_stage(ignore_virtual=True) and losses_reduced:
        value[0] = torch.stack([d["lm loss"] for d in losses_reduced]).mean()
        dist.all_reduce(value, group=ps.get_data_parallel_group())
        value /= ps.get_data_parallel_world_size()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(value, src=pp_last_rank, group=ps.get_pipeline_model_parallel_group())
    return float(value[0])


def pretrain(args: TrainingArgs, return_model: bool = False):
    """Train up to iteration ``args.train_iters`` with TP x PP x DP (resuming after ``args.load``'s iteration);
    returns the loss of every step run, on every rank (and the DDP-wrapped model chunks with ``return_model``)."""
    if not dist.is_initialized():
        raise RuntimeError("pretrain needs torch.distributed initialised (use torchrun or the CLI)")
    _check_args(args, dist.get_world_size())
    owns_mpu = not ps.model_parallel_is_initialized()
    if owns_mpu:
        ps.initialize_model_parallel(args.tp, args.pp, args.vpp)
    try:
        # Megatron's _set_random_seed: the default generator (init draws, dropout outside TP regions) is seeded
        # alike on every rank; the tracker adds the per-TP-rank state for dropout inside TP regions
        torch.manual_seed(args.seed)
        model_parallel_cuda_manual_seed(args.seed)
        config = args.transformer_config()
        model = build_model(args, config)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                            clip_grad=args.clip_grad, use_distributed_optimizer=args.use_distributed_optimizer),
            model)
        forward_backward = get_forward_backward_func()
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        last_rank = ps.get_pipeline_model_parallel_last_rank()
        start = 1
        if args.load:
            from mega_par.checkpointing import load_checkpoint

            start = load_checkpoint(args.load, model, optimizer) + 1
        losses = []
        for iteration in tqdm(range(start, args.train_iters + 1), disable=not args.progress or dist.get_rank() != 0,
                              desc="train"):
            mbs = microbatches(args, global_batch(args, iteration, dp), dp_rank)
            iterators = [iter(mbs) for _ in model]
            optimizer.zero_grad()
            losses_reduced = forward_backward(forward_step_func=forward_step,
                                              data_iterator=iterators if args.vpp else iterators[0],
                                              model=model if args.vpp else model[0],
                                              num_microbatches=args.num_microbatches, seq_length=args.seq_length,
                                              micro_batch_size=args.micro_batch_size)
            _, grad_norm, _ = optimizer.step()
            losses.append(_step_loss(losses_reduced, last_rank))
            logger.info("iteration %d loss %.6f grad_norm %.4f", iteration, losses[-1], grad_norm)
            if args.save and ((args.save_interval and iteration % args.save_interval == 0)
                              or iteration == args.train_iters):
                from mega_par.checkpointing import save_checkpoint

                save_checkpoint(iteration, model, optimizer, args)
        return (losses, model) if return_model else losses
    finally:
        if owns_mpu:
            ps.destroy_model_parallel()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mega-par-train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = TrainingArgs()
    for f in dataclasses.fields(TrainingArgs):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", default=default)
        else:
            kind = {"dp": int, "vpp": int, "num_query_groups": int, "ffn_hidden_size": int, "bucket_size": int,
                    "save_interval": int, "data_path": str, "save": str, "load": str}.get(f.name, type(default))
            p.add_argument(flag, type=kind, default=default)
    p.add_argument("--no-swiglu", dest="swiglu", action="store_false", help="plain GeLU MLP instead of SwiGLU")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    return p


def main(argv=None) -> int:
    parsed = _parser().parse_args(argv)
    timeout = parsed.timeout
    args = TrainingArgs(**{k: v for k, v in vars(parsed).items() if k != "timeout"})
    # progress from rank 0 only (Megatron logs from one rank too); warnings and errors from every rank
    quiet = int(os.environ.get("RANK", "0")) != 0
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    _check_args(args, world)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29512"),
                              RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    try:
        if dist.get_rank() == 0:
            print(ps.rank_grid(dist.get_world_size(), args.tp, args.pp))
        losses = pretrain(args)
        if dist.get_rank() == 0:
            for i, loss in enumerate(losses, 1):
                print(f"iteration {i:4d} | lm loss {loss:.6f}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
