"""vLLM's current offline examples (``examples/basic/chat.py`` + ``utils.py``, ``examples/basic/generate.py``,
``examples/prefix_caching.py``) run on paged-serve with only their import lines changed: the model names they
hard-code (``meta-llama/Llama-3.2-1B-Instruct``, ``facebook/opt-125m``) resolve from a hub cache the test writes
(a tiny Llama and a tiny OPT saved by transformers), offline. What they print is checked against transformers'
chat template and greedy ``generate`` on the same checkpoints."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from paged_serve import LLM, SamplingParams
from transformers import AutoTokenizer

from .conftest import _save_tokenizer, build_checkpoint
from .hub_cache import add_to_hub_cache
from .test_examples import EXAMPLES, _upstream

SCRIPTS = ["basic/chat.py", "basic/utils.py", "basic/generate.py", "prefix_caching.py"]
CHAT_MODEL, OPT = "meta-llama/Llama-3.2-1B-Instruct", "facebook/opt-125m"
# generate.py's sampling comes from the model: 5 new tokens, top_k=1 (greedy whatever the temperature)
GENERATION_CONFIG = {"max_new_tokens": 5, "top_k": 1, "do_sample": True, "bos_token_id": 0, "eos_token_id": 1}


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_example_differs_from_upstream_only_in_its_imports(name):
    body, sha = _upstream(EXAMPLES / name)
    assert hashlib.sha256(body.encode()).hexdigest() == sha
    changed = [line for line in (EXAMPLES / name).read_text().splitlines() if line.startswith("#   + ")]
    assert changed and all(line.startswith(("#   + from paged_serve", "#   + import paged_serve")) for line in changed)


def _tiny_opt(path):
    """A tiny OPT (the family of vLLM's default example model) with the tests' tokenizer, saved by transformers;
    weights wider than OPT's 0.02 init so greedy picks have no near-ties."""
    from transformers import OPTConfig, OPTForCausalLM

    vocab = _save_tokenizer(path)
    torch.manual_seed(1)
    config = OPTConfig(vocab_size=vocab, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=1024, bos_token_id=0, eos_token_id=1, pad_token_id=1)  # fmt: skip
    model = OPTForCausalLM(config).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.2) if p.dim() > 1 else p.data.uniform_(-0.5, 0.5)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The hub cache: the chat model (with a generation_config.json) and a long-context model for prefix caching;
    returns (environment for the scripts, {name: (snapshot dir, transformers model)})."""
    root = tmp_path_factory.mktemp("examples-hub")
    chat_dir, opt_dir = root / "chat", root / "opt"
    chat = build_checkpoint(chat_dir, max_position_embeddings=512)
    (chat_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    opt = _tiny_opt(opt_dir)
    models = {CHAT_MODEL: (add_to_hub_cache(root / "hub", CHAT_MODEL, chat_dir, "1" * 40), chat),
              OPT: (add_to_hub_cache(root / "hub", OPT, opt_dir, "2" * 40), opt)}  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(root / "hub")}  # fmt: skip
    return env, models


def _run(script, args, env, timeout=300):
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=EXAMPLES / os.path.dirname(script),
                          env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _greedy(hf, ids, n) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0, len(ids) :]
    out = out.tolist()
    return out[: out.index(1) + 1] if 1 in out else out  # </s> (id 1) ends it, as the engine stops there


def test_chat_py_prints_transformers_chat_prompts_and_greedy_replies(hub):
    env, models = hub
    snapshot, hf = models[CHAT_MODEL]
    out = _run("basic/chat.py", ["--max-tokens", "8", "--temperature", "0", "--num-gpu-blocks", "256"], env)
    prompts = [ast.literal_eval(p) for p in re.findall(r"^Prompt: (.*)$", out, re.M)]
    texts = [ast.literal_eval(t) for t in re.findall(r"^Generated text: (.*)$", out, re.M)]
    assert len(prompts) == len(texts) == 11  # one conversation, then a batch of ten
    tok = AutoTokenizer.from_pretrained(snapshot)
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    want_prompt = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert set(prompts) == {want_prompt}
    ids = tok(want_prompt, add_special_tokens=False).input_ids
    want = _greedy(hf, ids, 8)
    (ours,) = LLM(str(snapshot), num_gpu_blocks=256).chat(conversation, SamplingParams(temperature=0, max_tokens=8),
                                                          use_tqdm=False)  # fmt: skip
    assert ours.outputs[0].token_ids == want
    assert set(texts) == {ours.outputs[0].text}


def test_generate_py_samples_with_the_model_s_generation_config(hub):
    env, models = hub
    snapshot, hf = models[CHAT_MODEL]
    out = _run("basic/generate.py", ["--num-gpu-blocks", "256"], env)
    printed = re.findall(r"^Prompt: (.*), Generated text: (.*)$", out, re.M)
    prompts = [ast.literal_eval(p) for p, _ in printed]
    assert prompts == ["Hello, my name is", "The president of the United States is", "The capital of France is",
                       "The future of AI is"]  # fmt: skip
    llm = LLM(str(snapshot), num_gpu_blocks=256)
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [ast.literal_eval(t) for _, t in printed] == [o.outputs[0].text for o in greedy]
    for o in greedy:  # 5 tokens of top_k=1 sampling: transformers' greedy tokens
        assert o.outputs[0].token_ids == _greedy(hf, o.prompt_token_ids, 5)
    assert any(len(o.outputs[0].token_ids) == 5 for o in greedy)  # not vLLM's default of 16


def test_prefix_caching_py_gets_the_same_answers_from_a_second_llm(hub):
    env, models = hub
    snapshot, hf = models[OPT]
    out = _run("prefix_caching.py", [], env)
    assert "Generated answers are the same: True" in out
    texts = [ast.literal_eval(t) for t in re.findall(r"^Generated text: (.*)$", out, re.M)]
    assert len(texts) == 8 and texts[:4] == texts[4:]
    prompt = ast.literal_eval(re.findall(r"^Prompt: (.*)$", out, re.M)[0])
    llm = LLM(str(snapshot), num_gpu_blocks=256)
    (first,) = llm.generate([prompt], SamplingParams(temperature=0), use_tqdm=False)
    assert first.outputs[0].text == texts[0]
    assert first.outputs[0].token_ids == _greedy(hf, first.prompt_token_ids, 16)


def test_current_vllm_scripts_import_path_of_flexible_argument_parser():
    """vLLM's current examples (chat.py, generate.py since utils became a package) import it from here."""
    from paged_serve.utils import FlexibleArgumentParser
    from paged_serve.utils.argparse_utils import FlexibleArgumentParser as current

    assert current is FlexibleArgumentParser
    parser = current()
    parser.add_argument("--max-tokens", type=int)
    assert parser.parse_args(["--max_tokens=3"]).max_tokens == 3  # underscores in a flag become dashes
