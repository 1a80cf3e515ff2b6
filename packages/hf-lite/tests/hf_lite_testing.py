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
