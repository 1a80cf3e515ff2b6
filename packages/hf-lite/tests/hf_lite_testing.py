"""Test helpers for hf-lite (imported by name: conftest puts this directory on sys.path)."""

from __future__ import annotations

import glob
import os
import sysconfig

import torch
from hf_lite import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

SPECIALS = ["<|endoftext|>", "<pad>", "<|im_start|>", "<|im_end|>"]


def tiny_gpt2_config(**kw) -> GPT2Config:
    base = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    base.update(kw)
    return GPT2Config(**base)


def tiny_llama_config(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(kw)
    return LlamaConfig(**base)


def make_model(kind: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    if kind == "gpt2":
        return GPT2LMHeadModel(tiny_gpt2_config(**kw)).eval()
    return LlamaForCausalLM(tiny_llama_config(**kw)).eval()


def stdlib_texts(n_files: int = 30) -> list[str]:
    """Python's own standard-library sources: a local corpus read at run time (nothing downloaded)."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    assert len(files) >= n_files, "the stdlib corpus is unexpectedly small"
    return [open(f, encoding="utf-8", errors="replace").read() for f in files[:n_files]]


# ---------------------------------------------------------------------- Trainer tests
def corpus_blocks(tokenizer_dir: str, n_blocks: int = 32, block_size: int = 24) -> list[dict]:
    """The stdlib corpus, BPE-tokenised and grouped into ``block_size`` blocks of input_ids/labels."""
    from hf_lite import AutoTokenizer, GroupedTextsDataset

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    dataset = GroupedTextsDataset(tok, stdlib_texts(4), block_size)
    assert len(dataset) >= n_blocks, "the corpus is unexpectedly small"
    return [dataset[i] for i in range(n_blocks)]


def trainer_model(vocab_size: int = 800, seed: int = 0, **kw):
    """A tiny Llama (hidden 32, 2 layers) for training tests; dropout is 0 in Llama's config."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(vocab_size=vocab_size, **kw))


def training_args(output_dir, **kw):
    from hf_lite import TrainingArguments

    base = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=6,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        optim="adamw_torch",
    )
    base.update(kw)
    return TrainingArguments(**base)


def logged(trainer, key: str = "loss") -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]
