"""DeepSpeedExamples' ``training/HelloDeepSpeed/train_bert_ds.py`` (commit 45b4b71), rebuilt as a test of our own:
the script itself is not kept in ``examples/`` (the tools this project reads upstream code with forbid committing
it). What the script does with DeepSpeed, on DeepSpeed and on ds_zero in the same 2 ranks:

- transformers' RoBERTa encoder under an MLM loss over the masked positions only (the script's ``RobertaMLMModel``),
  masking 15% of the tokens (of those 80% ``<mask>``, 10% a random token, 10% kept), dropout 0.1;
- its engine config: Adam lr 1e-4, bf16, ZeRO stage 1 with the optimizer offloaded to the CPU;
- its loop: ``model(**batch)``, ``backward``, ``step``, the running mean logged as "Loss: {:.4f}" through
  ``log_dist(..., ranks=[0])``, ``save_checkpoint(save_dir, client_state={'checkpoint_step': step})`` every 3 steps
  and at the end; and its resume: ``load_checkpoint(load_dir)``, training on from ``checkpoint_step + 1``.

Test-only: a 2-layer model, a 96-token vocabulary, seeded random token batches for wikitext, and DeepSpeed's torch
Adam (``torch_adam``, ``zero_force_ds_cpu_optimizer`` false: no C++ op is built) on both sides.
"""

from __future__ import annotations

import logging

import pytest

from harness import run_ranks

VOCAB, PAD, MASK, SEQ, BATCH = 96, 1, 4, 16, 4
CHECKPOINT_EVERY, LOG_EVERY = 3, 1


def _batches(rank: int, n: int):
    """The script's masking of seeded random sequences (padded tails), this rank's ``n`` batches."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(n):
        tokens = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
        lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=gen)
        attention = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
        tokens = tokens.masked_fill(attention == 0, PAD)
        masked = (torch.rand(BATCH, SEQ, generator=gen) < 0.15) & (attention == 1)
        tgt = torch.where(masked, tokens, torch.full_like(tokens, PAD))
        how = torch.rand(BATCH, SEQ, generator=gen)
        src = torch.where(masked & (how < 0.8), torch.full_like(tokens, MASK), tokens)
        random_tokens = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
        src = torch.where(masked & (how >= 0.8) & (how < 0.9), random_tokens, src)
        yield {"src_tokens": src, "attention_mask": attention, "tgt_tokens": tgt}


def _mlm_model():
    import torch
    from transformers import RobertaConfig, RobertaModel
    from transformers.models.roberta.modeling_roberta import RobertaLMHead

    class RobertaMLMModel(torch.nn.Module):
        def __init__(self, config, encoder):
            super().__init__()
            self.config, self.encoder, self.lm_head = config, encoder, RobertaLMHead(config)

        def forward(self, src_tokens, attention_mask, tgt_tokens):
            hidden, *_ = self.encoder(input_ids=src_tokens, attention_mask=attention_mask, return_dict=False)
            where = torch.nonzero((tgt_tokens != self.config.pad_token_id).view(-1)).view(-1)
            scores = self.lm_head(hidden.view(-1, hidden.size(-1))[where])
            return torch.nn.functional.cross_entropy(scores, tgt_tokens.view(-1)[where])

    config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                           max_position_embeddings=SEQ + 2, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
                           type_vocab_size=1, layer_norm_eps=1e-5)  # fmt: skip
    return RobertaMLMModel(config, RobertaModel(config, add_pooling_layer=False))


def _train(ds, rank, exp_dir, num_iterations, load_checkpoint_dir=None):
    """The script's ``train`` after its experiment folder: engine, optional resume, the loop, the checkpoints."""
    import torch

    torch.manual_seed(42)  # the script seeds once at start; each run here is a fresh start
    accelerator = ds.accelerator.get_accelerator()
    device = torch.device(accelerator.device_name() if accelerator.is_available() else "cpu")
    config = {"train_micro_batch_size_per_gpu": BATCH,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
              "zero_force_ds_cpu_optimizer": False}  # fmt: skip
    model = _mlm_model()
    model, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
    start_step, logged, losses = 1, [], []
    if load_checkpoint_dir is not None:
        _, client_state = model.load_checkpoint(load_dir=load_checkpoint_dir)
        start_step = client_state["checkpoint_step"] + 1
    model.train()
    step, first = start_step, torch.cat([p.detach().float().flatten() for p in model.module.parameters()]).tolist()
    for step, batch in enumerate(_batches(rank, num_iterations), start=start_step):
        if step >= num_iterations:
            break
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch)
        model.backward(loss)
        model.step()
        losses.append(loss.item())
        if step % LOG_EVERY == 0:
            line = f"Loss: {sum(losses) / len(losses):.4f}"
            ds.utils.log_dist(line, ranks=[0], level=logging.INFO)
            logged.append(line)
        if step % CHECKPOINT_EVERY == 0:
            model.save_checkpoint(save_dir=exp_dir, client_state={"checkpoint_step": step})
    if step % CHECKPOINT_EVERY != 0:
        model.save_checkpoint(save_dir=exp_dir, client_state={"checkpoint_step": step})
    params = torch.cat([p.detach().float().flatten() for p in model.module.parameters()]).tolist()
    return {"losses": losses, "logged": logged, "tag": open(f"{exp_dir}/latest").read().strip(), "first": first,
            "params": params}


def _hello(rank, world, root):
    import deepspeed
    import deepspeed.ops
    import ds_zero
    import torch

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    out = {}
    torch.set_num_threads(1)
    for name, ds in (("deepspeed", deepspeed), ("ds_zero", ds_zero)):
        exp_dir = f"{root}/{name}"
        out[name, "fresh"] = _train(ds, rank, exp_dir, num_iterations=4)  # steps 1-3, saved at 3
        out[name, "resume"] = _train(ds, rank, f"{root}/{name}_resumed", num_iterations=7, load_checkpoint_dir=exp_dir)
    return out


@pytest.mark.world_size(2)
def test_hello_deepspeed_train_bert_trains_saves_and_resumes_as_under_deepspeed(tmp_path):
    for got in run_ranks(_hello, 2, str(tmp_path), timeout=300):
        for mode in ("fresh", "resume"):
            ref, ours = got["deepspeed", mode], got["ds_zero", mode]
            assert ours["params"] == ref["params"], mode  # every parameter, bit for bit
            assert ours == ref, (mode, ours, ref)
        # the script's last save runs at the step the loop broke on (4): the resumed run trains steps 5 and 6
        assert [len(got["deepspeed", m]["losses"]) for m in ("fresh", "resume")] == [3, 2]
        fresh, resumed = got["deepspeed", "fresh"], got["deepspeed", "resume"]
        assert (fresh["tag"], resumed["tag"]) == ("global_step3", "global_step5")
        # the resumed run starts from the weights the fresh run ended with, not from a new initialisation
        assert resumed["first"] == fresh["params"] != fresh["first"]


def _logged_by_rank(rank, world):
    """What log_dist logs on this rank, DeepSpeed's and ours, for each ``ranks=`` the scripts pass (both loggers at
    INFO for it: DeepSpeed's default is WARNING, which hides log_dist's INFO lines)."""
    import deepspeed
    import deepspeed.utils
    import ds_zero
    import ds_zero.utils

    out = {}
    for name, lib in (("deepspeed", deepspeed), ("ds_zero", ds_zero)):
        lib.init_distributed()
        records, log = [], lib.utils.logger
        capture = logging.Handler()
        capture.emit = lambda record, records=records: records.append(record.getMessage())
        saved = log.level
        log.addHandler(capture)
        log.setLevel(logging.INFO)
        try:
            for ranks in (None, [0], [1], [-1], [0, 1]):
                records.clear()
                lib.utils.log_dist("Loss: 1.2345", ranks=ranks, level=logging.INFO)
                out[name, str(ranks)] = list(records)
        finally:
            log.removeHandler(capture)
            log.setLevel(saved)
        out[name, "level"] = log.level
    return out


def test_log_dist_logs_on_the_ranks_deepspeeds_does():
    for rank, got in enumerate(run_ranks(_logged_by_rank, 2, timeout=120)):
        for key in [*((str(r)) for r in (None, [0], [1], [-1], [0, 1])), "level"]:
            assert got["ds_zero", key] == got["deepspeed", key], key
        assert got["ds_zero", "[-1]"] == [f"[Rank {rank}] Loss: 1.2345"] and got["ds_zero", "None"] == []
