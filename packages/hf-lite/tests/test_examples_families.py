"""transformers' ``text-generation/run_generation.py`` and ``text-classification/run_glue.py`` run from
``examples/`` (hf-lite's imports) and as upstream (the test swaps the import lines back), on the same local
checkpoints and data: the same sampled continuations for each family hf-lite has (GPT-2, Llama, OPT), and the same
run_glue metrics and predictions with a tiny Llama and a CSV written here. Nothing is downloaded. Needs what
``test_examples.py`` needs (``datasets``, ``evaluate``, ``accelerate``); its helpers rebuild the upstream files."""

import json
import os
import subprocess
import sys

import pytest
import transformers
from hf_lite_testing import SPECIALS, stdlib_texts, trainer_model
from test_examples import ACCURACY, EXAMPLES, IMPORTS, upstream_source

GENERATION_IMPORTS = [
    ("""from hf_lite import (
    AutoTokenizer,
    GenerationMixin,
    GPT2LMHeadModel,
    GPT2Tokenizer,
    LlamaForCausalLM,
    OPTForCausalLM,
)
from transformers import (
    BloomForCausalLM,
    CTRLLMHeadModel,
    CTRLTokenizer,
    GPTJForCausalLM,
    OpenAIGPTLMHeadModel,
    OpenAIGPTTokenizer,
    XLMTokenizer,
    XLMWithLMHeadModel,
    XLNetLMHeadModel,
    XLNetTokenizer,
)
""", """from transformers import (
    AutoTokenizer,
    BloomForCausalLM,
    CTRLLMHeadModel,
    CTRLTokenizer,
    GenerationMixin,
    GPT2LMHeadModel,
    GPT2Tokenizer,
    GPTJForCausalLM,
    LlamaForCausalLM,
    OpenAIGPTLMHeadModel,
    OpenAIGPTTokenizer,
    OPTForCausalLM,
    XLMTokenizer,
    XLMWithLMHeadModel,
    XLNetLMHeadModel,
    XLNetTokenizer,
)
"""),
    ("from hf_lite.modeling_outputs import ", "from transformers.modeling_outputs import "),
]
GLUE_IMPORTS = [swap for swap in IMPORTS if "testing_utils" not in swap[0]]  # run_glue has no CaptureLogger
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(cwd, script, args):
    proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A byte-level BPE (vocab 800) and three tiny checkpoints sharing it: a Llama hf-lite saved, a GPT-2 and an OPT
    transformers saved."""
    from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer
    from tokenizers import pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("examples_families")
    tok = byte_level_bpe_tokenizer()
    bpe = trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIALS, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(stdlib_texts(6), trainer=bpe)
    tokenizer_config = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                        "pad_token": "<pad>", "model_max_length": 64}
    models = {
        "llama": trainer_model(pad_token_id=1),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=800, n_embd=32, n_layer=2, n_head=4,
                                                                     n_positions=64)),
        "opt": transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=800, hidden_size=32, num_hidden_layers=2,
                                                                  num_attention_heads=4, ffn_dim=37,
                                                                  max_position_embeddings=64,
                                                                  word_embed_proj_dim=16)),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
        tok.save(str(root / name / "tokenizer.json"))
        (root / name / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (root / "run_generation_upstream.py").write_text(upstream_source("run_generation.py", GENERATION_IMPORTS))
    return root


def _sequences(stdout: str) -> list[str]:
    """What run_generation prints after its first `=== GENERATED SEQUENCE` line."""
    start = stdout.index("=== GENERATED SEQUENCE 1 ===")
    return stdout[start:].split("=== GENERATED SEQUENCE ")[1:]


# Runs the scripts one after the other in one interpreter (each as __main__ with its own argv), so the six runs pay
# for importing torch, transformers and accelerate once; prints {key: the run's stdout} as JSON.
DRIVER = """
import contextlib, io, json, runpy, sys
outputs = {}
for key, script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        runpy.run_path(script, run_name="__main__")
    outputs[key] = out.getvalue()
print(json.dumps(outputs))
"""
MODEL_TYPES = ["llama", "gpt2", "opt"]


@pytest.fixture(scope="module")
def generations(workdir):
    """run_generation.py as upstream and as the drop-in, for each model type, on the same checkpoint and seed."""
    runs = []
    for model_type in MODEL_TYPES:
        args = ["--model_type", model_type, "--model_name_or_path", model_type, "--prompt", "def main(args):",
                "--length", "16", "--num_return_sequences", "3", "--use_cpu", "--seed", "7", "--p", "0.95",
                "--repetition_penalty", "1.2"]
        runs.append([f"{model_type}/theirs", str(workdir / "run_generation_upstream.py"), args])
        runs.append([f"{model_type}/ours", os.path.join(EXAMPLES, "run_generation.py"), args])
    (workdir / "driver.py").write_text(DRIVER)
    proc = _run(workdir, workdir / "driver.py", [json.dumps(runs)])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_run_generation_samples_what_transformers_samples(generations, model_type):
    theirs = _sequences(generations[f"{model_type}/theirs"])
    ours = _sequences(generations[f"{model_type}/ours"])
    assert len(theirs) == 3 and ours == theirs
    assert len({s.split("\n", 1)[1] for s in ours}) > 1, "sanity: the three samples differ"


# ------------------------------------------------------------------------------------------------------ run_glue.py
GLUE_ARGS = [
    "--model_name_or_path", "llama", "--train_file", "train.csv", "--validation_file", "valid.csv",
    "--test_file", "test.csv", "--do_train", "--do_eval", "--do_predict", "--max_seq_length", "32",
    "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "6",
    "--learning_rate", "1e-3", "--seed", "0", "--report_to", "none", "--save_strategy", "no", "--use_cpu",
    "--optim", "adamw_torch", "--disable_tqdm", "true", "--logging_steps", "1",
]  # fmt: skip
TIMINGS = ("_runtime", "_per_second")


def _label(line: str) -> int:
    return len(line) % 3


@pytest.fixture(scope="module")
def glue_workdir(workdir):
    """Three CSVs of stdlib source lines labelled by their length mod 3 (three classes), and the local accuracy
    metric `evaluate.load("accuracy")` finds in the working directory."""
    import csv

    lines = [line.strip() for line in stdlib_texts(6)[0].splitlines() if len(line.strip()) > 8][:80]
    for name, rows in (("train.csv", lines[:48]), ("valid.csv", lines[48:64]), ("test.csv", lines[64:80])):
        with open(workdir / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows([line, _label(line)] for line in rows)
    (workdir / "accuracy").mkdir(exist_ok=True)
    (workdir / "accuracy" / "accuracy.py").write_text(ACCURACY)
    (workdir / "run_glue_upstream.py").write_text(upstream_source("run_glue.py", GLUE_IMPORTS))
    return workdir


def _results(directory, name):
    results = json.loads((directory / name).read_text())
    return {k: v for k, v in results.items() if not k.endswith(TIMINGS)}


def test_run_glue_trains_evaluates_and_predicts_as_transformers(glue_workdir):
    _run(glue_workdir, glue_workdir / "run_glue_upstream.py", [*GLUE_ARGS, "--output_dir", "glue_t"])
    proc = _run(glue_workdir, os.path.join(EXAMPLES, "run_glue.py"), [*GLUE_ARGS, "--output_dir", "glue_o"])
    theirs_dir, ours_dir = glue_workdir / "glue_t", glue_workdir / "glue_o"
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        theirs, ours = _results(theirs_dir, name), _results(ours_dir, name)
        assert sorted(ours) == sorted(theirs), name
        assert ours == pytest.approx(theirs, rel=1e-5), name
    assert (ours_dir / "predict_results_None.txt").read_text() == (theirs_dir / "predict_results_None.txt").read_text()
    losses = [[h["loss"] for h in json.loads((d / "trainer_state.json").read_text())["log_history"] if "loss" in h]
              for d in (theirs_dir, ours_dir)]
    assert len(losses[0]) == 6 and losses[1] == pytest.approx(losses[0], rel=1e-6)  # the new score head's init too
    assert "***** eval metrics *****" in proc.stdout + proc.stderr
    config = json.loads((ours_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 3
    again = transformers.AutoModelForSequenceClassification.from_pretrained(ours_dir)
    assert again.config.num_labels == 3
