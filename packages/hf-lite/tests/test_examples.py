"""transformers' own example scripts, run unchanged but for their import lines (``examples/``), side by side with
the upstream file under transformers: the same command on the same local data ends with the same eval loss and
writes a checkpoint both libraries load. Each upstream file is rebuilt from the drop-in by swapping its import
lines back (so the test also proves the diff is those lines only).

The data is local (stdlib sources as --train_file / --validation_file), the model a tiny random Llama saved here,
and ``evaluate.load("accuracy")`` finds the ``accuracy/`` metric directory this test writes in the working
directory (evaluate loads local metric scripts by name), so nothing is downloaded. Needs ``datasets``, ``evaluate``
and ``accelerate`` (transformers' Trainer)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from hf_lite_testing import SPECIALS, stdlib_texts, trainer_model

pytest.importorskip("datasets", reason="the example scripts load their data with `datasets`")
pytest.importorskip("evaluate", reason="run_clm.py computes accuracy with `evaluate`")
pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
IMPORTS = [
    ("import hf_lite as transformers\n", "import transformers\n"),
    ("from hf_lite import (\n", "from transformers import (\n"),
    ("from hf_lite.testing_utils import ", "from transformers.testing_utils import "),
    ("from hf_lite.utils import ", "from transformers.utils import "),
    ("from hf_lite.utils.versions import ", "from transformers.utils.versions import "),
]
ACCURACY = """
import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="fraction of predictions equal to their references",
            citation="",
            inputs_description="predictions, references: int sequences",
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references):
        return {"accuracy": float(sum(p == r for p, r in zip(predictions, references)) / len(predictions))}
"""


def upstream_source(name: str, swaps=IMPORTS) -> str:
    """The upstream file: the drop-in without its header block, import lines (``swaps``: ours -> theirs) swapped
    back."""
    text = open(os.path.join(EXAMPLES, name), encoding="utf-8").read()
    head, rest = text.split("# hf-lite drop-in >>>\n", 1)
    header, body = rest.split("# hf-lite drop-in <<<\n", 1)
    assert "Upstream: huggingface/transformers" in header and "commit" in header
    source = head + body
    for ours, theirs in swaps:
        assert source.count(ours) == 1, f"{name}: {ours!r} should appear once"
        source = source.replace(ours, theirs)
    assert "hf_lite" not in source, f"{name}: hf_lite appears outside the import lines"
    return source


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny Llama + trained BPE checkpoint, text files, the local accuracy metric and the two scripts."""
    from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer
    from tokenizers import pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("run_clm")
    texts = stdlib_texts(6)
    tok = byte_level_bpe_tokenizer()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe = trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIALS, show_progress=False, initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer=bpe)
    (root / "ckpt").mkdir()
    tok.save(str(root / "ckpt" / "tokenizer.json"))
    trainer_model().save_pretrained(root / "ckpt")
    (root / "train.txt").write_text("\n".join(texts[:4]))
    (root / "valid.txt").write_text(texts[4][:20000])
    (root / "accuracy").mkdir()
    (root / "accuracy" / "accuracy.py").write_text(ACCURACY)
    (root / "run_clm_upstream.py").write_text(upstream_source("run_clm.py"))
    return root


def _run(workdir, script, out, per_device_batch, nproc=1, cache="cache"):
    args = [
        "--model_name_or_path", "ckpt", "--train_file", "train.txt", "--validation_file", "valid.txt",
        "--do_train", "--do_eval", "--output_dir", out, "--block_size", "32", "--max_steps", "6",
        "--per_device_train_batch_size", str(per_device_batch), "--per_device_eval_batch_size", str(per_device_batch),
        "--learning_rate", "1e-3", "--seed", "0", "--report_to", "none", "--save_strategy", "no", "--use_cpu",
        "--optim", "adamw_torch", "--disable_tqdm", "true", "--logging_steps", "1",
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(workdir / cache),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    launcher = [sys.executable]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run(
        [*launcher, str(script), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    with open(workdir / out / "eval_results.json", encoding="utf-8") as f:
        return json.load(f), proc


def _same_model_in_both_libraries(directory):
    import transformers
    from hf_lite import AutoModelForCausalLM

    ids = torch.tensor([[5, 17, 42, 99, 3]])
    ours = AutoModelForCausalLM.from_pretrained(directory)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def one_process(workdir):
    theirs, _ = _run(workdir, workdir / "run_clm_upstream.py", "out_t", 4, cache="cache_t")
    ours, proc = _run(workdir, os.path.join(EXAMPLES, "run_clm.py"), "out_o", 4, cache="cache_o")
    return theirs, ours, proc


def test_run_clm_ends_with_transformers_eval_loss(workdir, one_process):
    theirs, ours, proc = one_process
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-6)
    assert ours["eval_accuracy"] == pytest.approx(theirs["eval_accuracy"], rel=1e-6)
    assert ours["eval_samples"] == theirs["eval_samples"] and ours["perplexity"] == pytest.approx(theirs["perplexity"])
    t_train = json.loads((workdir / "out_t" / "train_results.json").read_text())
    o_train = json.loads((workdir / "out_o" / "train_results.json").read_text())
    assert o_train["train_loss"] == pytest.approx(t_train["train_loss"], rel=1e-6)
    assert o_train["train_samples"] == t_train["train_samples"]
    assert "***** eval metrics *****" in proc.stdout + proc.stderr
    for name in ("all_results.json", "trainer_state.json", "README.md", "tokenizer.json"):
        assert (workdir / "out_o" / name).is_file(), name
    state = json.loads((workdir / "out_o" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and [h["loss"] for h in state["log_history"] if "loss" in h]
    _same_model_in_both_libraries(workdir / "out_o")
    _same_model_in_both_libraries(workdir / "out_t")


TIMINGS = ("_runtime", "_per_second")


def _results(directory, name):
    """A results file without its timings, which differ run to run."""
    results = json.loads((directory / name).read_text())
    return {k: v for k, v in results.items() if not k.endswith(TIMINGS)}


def test_run_clm_under_torchrun_two_ranks_equals_transformers_two_ranks(workdir, one_process):
    """The same torchrun command under both libraries: DDP through each Trainer logs the same loss each step and
    writes the same results files (same keys; values to fp32 rounding) and a checkpoint both libraries load. Its 2
    ranks of batch 2 also end as one process of batch 4 did."""
    _run(workdir, workdir / "run_clm_upstream.py", "out_ddp_t", 2, nproc=2, cache="cache_ddp_t")
    _, proc = _run(workdir, os.path.join(EXAMPLES, "run_clm.py"), "out_ddp_o", 2, nproc=2, cache="cache_ddp_o")
    assert "distributed training: True" in proc.stdout + proc.stderr
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        theirs, ours = _results(workdir / "out_ddp_t", name), _results(workdir / "out_ddp_o", name)
        assert sorted(ours) == sorted(theirs), name
        assert ours == pytest.approx(theirs, rel=1e-6), name
    t_state = json.loads((workdir / "out_ddp_t" / "trainer_state.json").read_text())
    o_state = json.loads((workdir / "out_ddp_o" / "trainer_state.json").read_text())
    t_losses = [h["loss"] for h in t_state["log_history"] if "loss" in h]
    assert len(t_losses) == 6 and [h["loss"] for h in o_state["log_history"] if "loss" in h] == pytest.approx(
        t_losses, rel=1e-6
    )
    assert o_state["global_step"] == t_state["global_step"] == 6
    one_process_eval = one_process[0]
    assert _results(workdir / "out_ddp_o", "eval_results.json")["eval_loss"] == pytest.approx(
        one_process_eval["eval_loss"], rel=1e-5
    )
    _same_model_in_both_libraries(workdir / "out_ddp_o")
    _same_model_in_both_libraries(workdir / "out_ddp_t")
