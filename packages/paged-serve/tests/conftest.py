"""paged-serve test setup: Triton kernels run in the interpreter on CPU, plus builders of random paged KV caches.

``TRITON_INTERPRET=1`` must be in the environment before ``triton`` is first imported, so it is set here at import
time (pytest imports conftest.py before the test modules). Triton picks interpreted or compiled when a kernel is
defined, so one process cannot have both: on a CUDA machine the interpreter stays off and the ``device`` fixture
moves the small kernel tests to the GPU, where they run compiled next to the larger gpu-marked ones.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from paged_serve.ops import reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def new_children():
    """The child processes started since the test began. An xdist worker also holds the harness's pooled rank
    processes, kept alive between tests; they are not the engine's workers."""
    before = {p.pid for p in multiprocessing.active_children()}
    return lambda: [p for p in multiprocessing.active_children() if p.pid not in before]


@pytest.fixture
def device():
    """Where the Triton kernel tests run: interpreted on CPU, compiled on CUDA when a GPU is present."""
    return DEVICE


class PagedKV:
    """Random K/V for ``context_lens`` sequences scattered over shuffled cache blocks; everything else is NaN."""

    def __init__(self, context_lens, block_size, num_kv_heads, head_size, dtype, device="cpu", seed=0, spare=2):
        gen = torch.Generator().manual_seed(seed)
        self.context_lens_list = list(context_lens)
        self.block_size = block_size
        blocks_per_seq = [-(-n // block_size) for n in self.context_lens_list]
        num_blocks = sum(blocks_per_seq) + spare
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        self.key_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.value_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        perm = torch.randperm(num_blocks, generator=gen)
        poison = int(perm[-1])  # a never-written (all-NaN) block: padding entries point at it
        max_blocks = max(blocks_per_seq) + 1
        self.block_tables = torch.full((len(blocks_per_seq), max_blocks), poison, dtype=torch.int32)
        self.keys, self.values = [], []
        cursor = 0
        for s, (n, nb) in enumerate(zip(self.context_lens_list, blocks_per_seq)):
            table = perm[cursor : cursor + nb]
            cursor += nb
            self.block_tables[s, :nb] = table.to(torch.int32)
            k = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
            v = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
            pos = torch.arange(n)
            slots = table[pos // block_size] * block_size + pos % block_size
            reference.reshape_and_cache(k.to(device), v.to(device), self.key_cache, self.value_cache, slots.to(device))
            self.keys.append(k)
            self.values.append(v)
        self.block_tables = self.block_tables.to(device)
        self.context_lens = torch.tensor(self.context_lens_list, dtype=torch.int32, device=device)


@pytest.fixture
def paged_kv():
    return PagedKV


def sdpa_reference(q, k, v, causal_offset=None):
    """fp32 ``scaled_dot_product_attention`` of ``q`` [q_len, H, D] over contiguous ``k``/``v`` [L, Hkv, D].

    The new tokens are the last ``q_len`` of ``L``: a bottom-right causal mask for prefill.
    """
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    q_len, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    qf = q.float().transpose(0, 1)[None]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    length = k.shape[0]
    mask = torch.arange(length)[None, :] <= torch.arange(length - q_len, length)[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
    return out[0].transpose(0, 1)


@pytest.fixture
def sdpa():
    return sdpa_reference


# ---------------------------------------------------------------- tiny Hugging Face checkpoints
_CORPUS = [f"the quick brown fox jumps over the lazy dog {i} times, said the cat to the bird" for i in range(200)]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _save_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    hf.chat_template = _CHAT_TEMPLATE
    hf.save_pretrained(path)
    return len(hf)


def build_checkpoint(path, arch="llama", seed=0, max_shard_size=None, **overrides):
    """A tiny random model saved by transformers (weights, config, tokenizer) into ``path``; returns the model."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    vocab = _save_tokenizer(path)
    torch.manual_seed(seed)
    if arch == "llama":
        kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
        cfg = LlamaConfig(vocab_size=vocab, bos_token_id=0, eos_token_id=1, **{**kw, **overrides})
        model = LlamaForCausalLM(cfg)
    else:
        kw = dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, bos_token_id=0, eos_token_id=1, **{**kw, **overrides}))
    model.eval()
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return model


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """``checkpoint(arch, **config)`` -> (directory, transformers model); built once per distinct arguments."""
    cache = {}

    def make(arch="llama", **overrides):
        key = (arch, repr(sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(f"ckpt-{arch}")
            cache[key] = (str(path), build_checkpoint(path, arch, **overrides))
        return cache[key]

    return make


@pytest.fixture
def checkpoint_builder():
    """``build_checkpoint`` itself, for tests that need a checkpoint of their own (sharded, other seed)."""
    return build_checkpoint
