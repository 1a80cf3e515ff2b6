"""Cross-package integration: ``train-then-serve``'s training paths end in Hugging Face checkpoints that paged-serve
and transformers load alike, with the tokenizer hf-lite trained giving the same ids everywhere."""

from __future__ import annotations

import os
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
    [
        ["--trainer", "ds-zero", "--zero-stage", "3", "--offload", "nvme"],
        ["--trainer", "mega-par", "--tp", "2", "--sp"],
        ["--trainer", "pt-dist-ddp", "--device", "cpu"],  # pt-dist's own DDP / FSDP on its shm backend
        ["--trainer", "pt-dist-fsdp", "--device", "cpu"],
    ],
    ids=["ds-zero-stage3-nvme", "mega-par-tp2-sp", "pt-dist-ddp", "pt-dist-fsdp"],
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
    assert not (tmp_path / "nvme_swap").exists()  # ZeRO-Infinity's swap files are scratch
    assert "=== generations" in printed and "=== summary ===" in printed and (tmp_path / "loss_curve.png").is_file()
    assert f"{trainer[1]} on 2 rank(s), cpu" in printed
    prompts = serve.PROMPTS[:3]
    assert _greedy_paged(checkpoint, prompts, 10) == _greedy_transformers(checkpoint, prompts, 10)


def test_serve_tensor_parallel_2_serves_the_trained_checkpoint_on_two_ranks(corpus, tmp_path, capsys):
    before = _rank_children(os.getpid())  # under xdist the worker also holds the multi-rank plugin's pooled ranks
    _run(corpus, tmp_path, "--trainer", "pt-dist-ddp", "--device", "cpu", "--serve-tensor-parallel", "2")
    printed = capsys.readouterr().out
    assert "tensor-parallel 2" in printed
    one_rank, _, _ = serve.generate(str(tmp_path / "checkpoint"), "cpu", 8)  # the same generations on one rank
    for out in one_rank:
        assert f"--- prompt: {out.prompt!r}\n{out.prompt}{out.outputs[0].text}\n" in printed
    assert not _rank_children(os.getpid()) - before  # the serving workers are gone


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
        (["--trainer", "ds-zero", "--offload", "nvme"], "needs --zero-stage 3"),
        (["--corpus", "/nonexistent/corpus"], "does not exist"),
        (["--steps", "0"], "--steps"),
        (["--serve-tensor-parallel", "3"], "--serve-tensor-parallel 3 does not split"),
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


# The default command with fewer steps and a checkpoint every 4: run once, in this process, it is the test of the
# defaults and the uninterrupted run the Ctrl-C test's resumed run must end at.
COMMON = ["--steps", "16", "--save-steps", "4", "--lr", "1e-2", "--max-new-tokens", "2"]


@pytest.fixture(scope="module")
def default_run(corpus, tmp_path_factory) -> tuple[Path, str]:
    import contextlib
    import io

    out, printed = tmp_path_factory.mktemp("whole"), io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--corpus", str(corpus), "--out", str(out), *COMMON]) == 0
    return out, printed.getvalue()


def test_the_default_command_in_reduced_form(default_run):
    """``train-then-serve`` with its defaults (hf-lite Trainer + torch DDP on 2 ranks), fewer steps."""
    out, printed = default_run
    assert "hf-lite on 2 rank(s)" in printed and "=== generations" in printed and "=== summary ===" in printed
    first, last = map(float, printed.split("\nloss ")[1].split(" (perplexity")[0].split(" -> "))
    assert last < first  # the loss fell
    for prompt in serve.PROMPTS:
        assert f"--- prompt: {prompt!r}" in printed
    assert _greedy_paged(out / "checkpoint", serve.PROMPTS[:2], 6) == _greedy_transformers(
        out / "checkpoint", serve.PROMPTS[:2], 6
    )


def _rank_children(pid: int) -> set[int]:
    """The rank processes of ``pid``: spawned children of it, or children of its multiprocessing fork server
    (harness.run_ranks forks ranks from one; multiprocessing's resource tracker, which leaves with its parent, and
    the fork server itself are not ranks)."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                procs[int(entry.name)] = (int(fields[1]), (entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    servers = {p for p, (ppid, cmd) in procs.items() if ppid == pid and "forkserver" in cmd}
    return {p for p, (ppid, cmd) in procs.items()
            if (ppid == pid and "spawn_main" in cmd and "resource_tracker" not in cmd) or ppid in servers}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_after_a_checkpoint_then_resume_ends_where_the_uninterrupted_run_does(corpus, default_run, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    common = ["--corpus", str(corpus), *COMMON]
    cmd = [sys.executable, "-m", "harness.pipelines.train_then_serve"]
    whole, cut = default_run[0], tmp_path / "cut"
    proc = subprocess.Popen(cmd + common + ["--out", str(cut)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not list((cut / "hf_lite_trainer").glob("checkpoint-*")):
        assert proc.poll() is None and time.time() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    ranks = _rank_children(proc.pid)
    assert ranks, "no rank processes seen"
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "interrupted" in err.decode()
    assert not [p for p in ranks if _alive(p)], "rank processes outlived the interrupt"
    assert not (cut / "checkpoint").exists() and not (cut / "checkpoint.partial").exists()
    subprocess.run(cmd + common + ["--out", str(cut), "--resume"], check=True, capture_output=True, timeout=600)
    a, b = load_file(whole / "checkpoint" / "model.safetensors"), load_file(cut / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
