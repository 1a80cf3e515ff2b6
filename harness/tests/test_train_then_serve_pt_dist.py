"""``train-then-serve --trainer pt-dist-ddp`` (and ``pt-dist-fsdp``): pt-dist's data parallelism on its own shm
backend trains the hf-lite Llama, and the Hugging Face checkpoint it leaves serves in paged-serve exactly as in
transformers (the shape of test_train_then_serve.py's test_each_training_path_serves_like_transformers)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from harness.pipelines import serve
from harness.pipelines.train_then_serve import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.py"
    path.write_text("\n\n".join((STDLIB / name).read_text() for name in ("textwrap.py", "string.py", "shlex.py")))
    return path


def _greedy(checkpoint: Path, prompts: list[str], n: int) -> tuple[list, list]:
    import torch
    from paged_serve import LLM, SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(checkpoint).eval(), AutoTokenizer.from_pretrained(checkpoint)
    theirs = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        theirs.append(out[0, ids.shape[1] :].tolist())
    llm = LLM(str(checkpoint), num_gpu_blocks=64, num_cpu_blocks=0)
    ours = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in ours], theirs


@pytest.mark.parametrize("trainer", ["pt-dist-ddp", "pt-dist-fsdp"])
def test_pt_dist_training_serves_like_transformers(corpus, tmp_path, capsys, trainer):
    argv = ["--corpus", str(corpus), "--out", str(tmp_path), "--steps", "6", "--max-new-tokens", "8", "--lr", "1e-2",
            "--trainer", trainer, "--device", "cpu"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    checkpoint = tmp_path / "checkpoint"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (checkpoint / name).is_file(), name
    assert not (tmp_path / "checkpoint.partial").exists()
    assert "=== generations" in printed and "=== summary ===" in printed and (tmp_path / "loss_curve.png").is_file()
    assert f"{trainer} on 2 rank(s), cpu" in printed
    ours, theirs = _greedy(checkpoint, serve.PROMPTS[:3], 10)
    assert ours == theirs
