"""hf-lite's Trainer side by side with transformers' Trainer on the same tiny Llama, corpus and arguments (CPU,
fp32, no dropout): the logged loss, grad_norm and learning_rate of every step and the final parameters agree.

transformers' Trainer needs ``accelerate`` (in the workspace's dev group; outside it these tests skip, saying so).
Mirrors transformers' tests/trainer/test_trainer.py (test_gradient_accumulation_loss_alignment_with_model_loss,
test_trainer_works_with_dict, test_custom_optimizer/scheduler cases), hf-lite against transformers itself."""

import pytest
import torch
from hf_lite import Trainer, TrainingArguments
from hf_lite_testing import corpus_blocks, trainer_model

pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate (the workspace's dev group has it)")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def blocks(trained_tokenizer_dir):
    rows = corpus_blocks(trained_tokenizer_dir, n_blocks=30)
    for i, row in enumerate(rows):  # rows with different numbers of label tokens: the normalisation matters
        row["labels"] = row["labels"].clone()
        row["labels"][: i % 7] = -100
    return rows


def _side_by_side(tmp_path, blocks, **kw):
    ours = trainer_model()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    common = dict(
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=7,
        disable_tqdm=True,
        learning_rate=5e-3,
    )
    common.update(kw)
    t = transformers.Trainer(
        model=theirs,
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "t"), **common),
        train_dataset=blocks,
        eval_dataset=blocks[:10],
    )
    t.train()
    o = Trainer(
        ours,
        TrainingArguments(output_dir=str(tmp_path / "o"), **common),
        train_dataset=blocks,
        eval_dataset=blocks[:10],
    )
    o.train()
    return t, o


def _logs(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]


@pytest.mark.parametrize(
    "kw",
    [
        dict(
            gradient_accumulation_steps=2,
            max_steps=6,
            lr_scheduler_type="cosine",
            warmup_steps=2,
            weight_decay=0.1,
            max_grad_norm=0.5,
        ),
        dict(max_steps=5, lr_scheduler_type="linear", warmup_steps=0.4, adam_beta2=0.99, max_grad_norm=0.0),
        dict(
            gradient_accumulation_steps=3, num_train_epochs=2, lr_scheduler_type="constant_with_warmup", warmup_steps=1
        ),
        dict(max_steps=4, lr_scheduler_type="constant", per_device_train_batch_size=3, optim="adamw_torch"),
    ],
    ids=["accum2-cosine-decay-clip", "linear-ratio-warmup", "accum3-epochs-remainder", "constant-adamw"],
)
def test_loss_grad_norm_lr_and_parameters_match_transformers_trainer(tmp_path, blocks, kw):
    theirs, ours = _side_by_side(tmp_path, blocks, **kw)
    assert ours.state.global_step == theirs.state.global_step
    for key in ("loss", "grad_norm", "learning_rate", "epoch"):
        torch.testing.assert_close(_logs(ours, key), _logs(theirs, key), rtol=1e-5, atol=1e-6, msg=key)
    their_params = theirs.model.state_dict()
    for key, value in ours.model.state_dict().items():
        torch.testing.assert_close(value, their_params[key], rtol=1e-5, atol=1e-6, msg=key)


def test_evaluate_matches_transformers_trainer(tmp_path, blocks):
    theirs, ours = _side_by_side(tmp_path, blocks, max_steps=2, per_device_eval_batch_size=4)
    a, b = ours.evaluate(), theirs.evaluate()
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6)
    assert a["epoch"] == pytest.approx(b["epoch"])


@pytest.fixture(scope="module")
def padded_rows(trained_tokenizer_dir):
    """training.md's data: paragraphs of different lengths tokenized with truncation, padded per batch."""
    from hf_lite import AutoTokenizer
    from hf_lite_testing import stdlib_texts

    tok = AutoTokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")
    paragraphs = [p for text in stdlib_texts(3) for p in text.split("\n\n") if p.strip()][:48]
    rows = [dict(tok(p, truncation=True, max_length=40)) for p in paragraphs]
    assert len({len(r["input_ids"]) for r in rows}) > 5, "rows of different lengths: batches are padded"
    return tok, rows


def test_training_md_bf16_padded_gqa_run_matches_transformers_per_step(tmp_path, padded_rows, monkeypatch):
    """training.md's Trainer run (bf16, gradient accumulation, DataCollatorForLanguageModeling padding, a GQA model,
    evaluation each epoch): the two Trainers parted at the first backward, in the K/V gradients of masked attention
    (SDPA's GQA sums them over the query group in fp32, transformers' repeated heads in bf16)."""
    from hf_lite import DataCollatorForLanguageModeling

    tok, rows = padded_rows
    grads = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(parameters, *args, **kwargs):
        parameters = list(parameters)
        grads.append([p.grad.detach().clone() for p in parameters])
        return clip(parameters, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    ours = trainer_model(vocab_size=len(tok))
    assert ours.config.num_key_value_heads < ours.config.num_attention_heads
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    common = dict(num_train_epochs=2, per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True,
                  learning_rate=2e-3, logging_steps=1, eval_strategy="epoch", save_strategy="no", report_to="none",
                  disable_tqdm=True, use_cpu=True, seed=3)
    their_args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), **common)
    t = transformers.Trainer(model=theirs, args=their_args, train_dataset=rows[:24], eval_dataset=rows[24:30],
                             data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False))
    t.train()
    their_grads, grads[:] = list(grads), []
    o = Trainer(ours, TrainingArguments(output_dir=str(tmp_path / "o"), **common), train_dataset=rows[:24],
                eval_dataset=rows[24:30], data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    o.train()
    assert len(grads) == len(their_grads) == o.state.global_step == 6
    for ours_g, theirs_g in zip(grads[0], their_grads[0]):  # the step where they parted
        torch.testing.assert_close(ours_g, theirs_g, rtol=1e-6, atol=0)
    for key in ("loss", "grad_norm", "learning_rate", "eval_loss"):
        torch.testing.assert_close(_logs(o, key), _logs(t, key), rtol=1e-6, atol=0, msg=key)
    for key, value in o.model.state_dict().items():
        torch.testing.assert_close(value, t.model.state_dict()[key], rtol=1e-6, atol=1e-7, msg=key)
