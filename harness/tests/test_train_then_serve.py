"""Cross-package integration: ``train-then-serve``'s training paths end in Hugging Face checkpoints that paged-serve
and transformers load alike, with the tokenizer hf-lite trained giving the same ids everywhere."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch
from harness.pipelines import serve
from harness.pipelines.train_then_serve import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small fixed corpus: three standard-library modules."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.py"
    path.write_text("\n\n".join((STDLIB / name).read_text() for name in ("textwrap.py", "string.py", "shlex.py")))
    return path


def _run(corpus: Path, out: Path, *extra: str) -> None:
    argv = ["--corpus", str(corpus), "--out", str(out), "--steps", "6", "--max-new-tokens", "8", "--lr", "1e-2"]
    assert main(argv + list(extra)) == 0


def _greedy_transformers(checkpoint: Path, prompts: list[str], n: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tok = AutoTokenizer.from_pretrained(checkpoint)
    outs = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        outs.append(out[0, ids.shape[1] :].tolist())
    return outs


def _greedy_paged(checkpoint: Path, prompts: list[str], n: int) -> list[list[int]]:
    from paged_serve import LLM, SamplingParams

    llm = LLM(str(checkpoint), num_gpu_blocks=64, num_cpu_blocks=0)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize(
    "trainer",
    [["--trainer", "ds-zero", "--zero-stage", "3"], ["--trainer", "mega-par", "--tp", "2", "--sp"]],
    ids=["ds-zero-stage3", "mega-par-tp2-sp"],
)
def test_each_training_path_serves_like_transformers(corpus, tmp_path, capsys, trainer):
    _run(corpus, tmp_path, *trainer)
    printed = capsys.readouterr().out
    checkpoint = tmp_path / "checkpoint"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (checkpoint / name).is_file(), name
    assert not (tmp_path / "checkpoint.partial").exists()
    assert "=== generations" in printed and "=== summary ===" in printed and (tmp_path / "loss_curve.png").is_file()
    prompts = serve.PROMPTS[:3]
    assert _greedy_paged(checkpoint, prompts, 10) == _greedy_transformers(checkpoint, prompts, 10)


def test_the_tokenizer_gives_the_same_ids_in_every_library(corpus, tmp_path):
    from harness.pipelines import corpus as corpus_mod
    from hf_lite import AutoTokenizer as LiteTokenizer
    from paged_serve.transformers_utils.tokenizer import Tokenizer
    from transformers import AutoTokenizer

    docs = corpus_mod.read_corpus(corpus, 200_000)
    corpus_mod.train_tokenizer(docs, 1024, tmp_path)
    texts = [docs[0][:500], "def f(x):\n    return x ** 2  # naïve — ünïcode ✓\n", "<|endoftext|>import os"]
    ours, theirs, lite = (
        Tokenizer(tmp_path),
        AutoTokenizer.from_pretrained(tmp_path),
        LiteTokenizer.from_pretrained(str(tmp_path)),
    )
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids == lite(text)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids) == text
    assert ours.eos_token_id == theirs.eos_token_id == theirs.convert_tokens_to_ids("<|endoftext|>")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--trainer", "mega-par", "--tp", "3"], "does not divide"),
        (["--trainer", "mega-par", "--tp", "2", "--nproc", "3"], "not a multiple"),
        (["--trainer", "ds-zero", "--zero-stage", "5"], "--zero-stage"),
        (["--trainer", "ds-zero", "--offload", "nvme"], "NVMe"),
        (["--trainer", "pt-dist-ddp"], "not built yet"),
        (["--corpus", "/nonexistent/corpus"], "does not exist"),
        (["--steps", "0"], "--steps"),
    ],
)
def test_bad_arguments_fail_in_one_line_before_any_rank_starts(monkeypatch, capsys, tmp_path, corpus, argv, message):
    import harness.ranks

    def no_ranks(*a, **k):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(harness.ranks, "run_ranks", no_ranks)
    base = ["--out", str(tmp_path / "out"), "--corpus", str(corpus)]
    with pytest.raises(SystemExit) as exc:
        main(base + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train-then-serve: error:") and message in err[0], err


def test_an_unwritable_out_and_an_unknown_trainer_are_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(blocker / "sub")])
    assert exc.value.code == 2 and "not writable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--trainer", "horovod"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
