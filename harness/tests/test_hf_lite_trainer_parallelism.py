"""hf-lite's Trainer driving other data-parallel code through its extension point (``DataParallelPlugin``), plugged
in by user code here, so hf-lite never imports either: this repository's ds-zero ZeRO engine, and torch's DDP over a
pt-dist process group with the Trainer's agreement collectives (token counts, losses, metrics, stop flags) on pt-dist.

2 ranks (gloo) with ZeRO stage 1 and 2 train exactly as one hf-lite process with the doubled batch (loss, grad norm,
final weights), with gradient accumulation and clipping done by the engine; each rank writes its own optimizer
partition into the Trainer's checkpoints, and a run resumed from one reproduces the uninterrupted losses.

pt-dist's own DistributedDataParallel does not exist yet (pt_dist.nn holds only the functional collectives), so it
cannot be plugged in here; what pt-dist offers is a torch ProcessGroup under each gloo/nccl adapter group (``.pg``),
which torch's DDP accepts (pt-dist's README recipe), and that is what the second test plugs in. Plain torch DDP, the
Trainer's default, is covered by packages/hf-lite/tests/test_trainer_distributed.py.
"""

import os
import sys

import pytest
import torch

from harness import run_ranks

ds_zero = pytest.importorskip("ds_zero")
from hf_lite import (  # noqa: E402
    DataParallelPlugin,
    LlamaConfig,
    LlamaForCausalLM,
    TorchDDPPlugin,
    Trainer,
    TrainingArguments,
)


class DeepSpeedZeroPlugin(DataParallelPlugin):
    """ds_zero's engine behind the Trainer: the engine owns reduction, clipping and the optimizer step (as
    transformers' DeepSpeed integration hands them to DeepSpeed); the Trainer keeps data, loss and schedule."""

    sharded_optimizer_state = True  # each rank holds its ZeRO partition of the optimizer state

    def __init__(self, stage: int):
        self.stage, self.engine = stage, None

    def prepare(self, model, optimizer, args):
        config = {
            "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "gradient_clipping": args.max_grad_norm,
            "zero_optimization": {"stage": self.stage},
        }
        self.engine, _, _, _ = ds_zero.initialize(model=model, optimizer=optimizer, config=config)
        return self.engine, optimizer  # the torch optimizer now steps the fp32 master partitions; its lr is scheduled

    def backward(self, loss, model):
        # The Trainer already normalised the loss over the accumulated batch; DeepSpeed divides by the steps again.
        self.engine.backward(loss * self.engine.gradient_accumulation_steps())
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()  # only advances the engine's micro-step counter

    def clip_grad_norm_(self, model, max_norm):
        return None  # the engine clips inside its step, on the reduced partitions

    def optimizer_step(self, optimizer):
        skipped = self.engine.skipped_steps
        self.engine.step()
        return self.engine.skipped_steps == skipped

    def get_global_grad_norm(self):
        return self.engine.get_global_grad_norm()

    def zero_grad(self, model, optimizer):
        if self.engine is not None:
            self.engine.zero_grad()

    def unwrap_model(self, model):
        return model.module if model is self.engine else model

    def optimizer_state_dict(self, optimizer):
        return self.engine.optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state_dict):
        self.engine.optimizer.load_state_dict(state_dict)


def _data():
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(16):
        ids = torch.randint(3, 97, (12,), generator=g)
        labels = ids.clone()
        labels[: i % 5] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _train(out_dir, batch_size, plugin=None, resume=None, **kw):
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        max_steps=6,
        gradient_accumulation_steps=2,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        weight_decay=0.01,
        max_grad_norm=0.5,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        optim="adamw_torch",
        **kw,
    )
    trainer = Trainer(model, args, train_dataset=_data(), parallelism=plugin)
    trainer.train(resume_from_checkpoint=resume)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    params = {k: v.detach().clone() for k, v in trainer.parallelism.unwrap_model(trainer.model).state_dict().items()}
    return [h["loss"] for h in logs], [h["grad_norm"] for h in logs], params


def _zero_ranks(rank, world_size, root, stage):
    out = _train(f"{root}/zero{stage}", 2, DeepSpeedZeroPlugin(stage), save_strategy="steps", save_steps=2)
    files = sorted(os.listdir(f"{root}/zero{stage}/checkpoint-2"))
    resumed = _train(f"{root}/zero{stage}", 2, DeepSpeedZeroPlugin(stage), resume=f"{root}/zero{stage}/checkpoint-2")
    return out, files, resumed[0]


@pytest.mark.parametrize("stage", [1, 2])
def test_ds_zero_engine_through_the_trainer_equals_one_process(tmp_path, stage):
    assert "ds_zero" not in sys.modules.get("hf_lite.trainer").__dict__  # the Trainer knows nothing of it
    ranks = run_ranks(_zero_ranks, 2, str(tmp_path), stage, timeout=300)
    losses, norms, params = _train(tmp_path / "single", 4)
    for (r_losses, r_norms, r_params), files, resumed in ranks:
        torch.testing.assert_close(r_losses, losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r_norms, norms, rtol=1e-5, atol=1e-6)
        for key, value in params.items():
            torch.testing.assert_close(r_params[key], value, rtol=1e-5, atol=1e-6, msg=key)
        assert {"rank0-of-2-optimizer.pt", "rank1-of-2-optimizer.pt", "model.safetensors", "trainer_state.json"} <= set(
            files
        )
        assert resumed == r_losses  # resumed from checkpoint-2: the same losses exactly


class PtDistDDPPlugin(TorchDDPPlugin):
    """torch's DDP over a pt-dist group's torch ProcessGroup; the Trainer's own collectives go through pt-dist."""

    def __init__(self, group):
        super().__init__(process_group=group.pg)
        self.group = group

    def all_reduce(self, tensor, op=None):
        import pt_dist

        pt_dist.all_reduce(tensor, op=op if op is not None else pt_dist.ReduceOp.SUM, group=self.group)
        return tensor

    def broadcast_object(self, obj, src: int = 0):
        import pt_dist

        holder = [obj]
        pt_dist.broadcast_object_list(holder, src=src, group=self.group)
        return holder[0]

    def all_gather_object(self, obj) -> list:
        import pt_dist

        out = [None] * self.world_size
        pt_dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        import pt_dist

        pt_dist.barrier(group=self.group)


def _pt_dist_ranks(rank, world_size, root):
    import pt_dist

    import harness

    if rank == 0:  # pt-dist's authenticated store; its port reaches the other rank through the harness's store
        store = pt_dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=60)
        harness.store().set("hf_lite_pt_dist_port", str(store.port))
    else:
        port = int(harness.store().get("hf_lite_pt_dist_port"))
        store = pt_dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=60)
    pt_dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=60)
    try:
        group = pt_dist.new_group(list(range(world_size)))
        out = _train(f"{root}/pt_dist", 2, PtDistDDPPlugin(group), save_strategy="steps", save_steps=3)
        return out, sorted(os.listdir(f"{root}/pt_dist/checkpoint-3"))
    finally:
        pt_dist.barrier()  # rank 0 hosts the store: nobody leaves before the others are done
        pt_dist.destroy_process_group()


def test_torch_ddp_over_a_pt_dist_group_equals_one_process(tmp_path):
    pytest.importorskip("pt_dist")
    ranks = run_ranks(_pt_dist_ranks, 2, str(tmp_path), backend=None, timeout=300)
    losses, norms, params = _train(tmp_path / "single", 4)
    for (r_losses, r_norms, r_params), files in ranks:
        torch.testing.assert_close(r_losses, losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r_norms, norms, rtol=1e-5, atol=1e-6)
        for key, value in params.items():
            torch.testing.assert_close(r_params[key], value, rtol=1e-5, atol=1e-6, msg=key)
        assert {"optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(files)
