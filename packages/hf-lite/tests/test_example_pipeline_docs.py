"""transformers' doc pages as examples: the text-generation parts of ``pipeline_tutorial.md`` and
``chat_templating.md`` (the chat pipeline), and ``training.md``'s Trainer run (``examples/pipeline_tutorial.py``,
``chat_templating_pipeline.py``, ``training.py``). Each runs under hf-lite and, with its imports swapped back, under
transformers, on the same local tiny Llama with a chat template; both print the same results (sampled with the same
seed and the pipeline's defaults: 256 new tokens, temperature 0.7; training.md's bf16 run step for step)."""

import os
import subprocess
import sys

import pytest
from hf_lite import PreTrainedTokenizerFast
from hf_lite_testing import make_model

pytest.importorskip("accelerate", reason="pipeline_tutorial.md takes its device from accelerate.Accelerator")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
IMPORTS = [("from hf_lite import pipeline", "from transformers import pipeline"),
           ("from hf_lite import A", "from transformers import A")]
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, trained_tokenizer_dir):
    directory = tmp_path_factory.mktemp("chat_llama")
    tok = PreTrainedTokenizerFast.from_pretrained(trained_tokenizer_dir, pad_token="<pad>", eos_token="<|im_end|>",
                                                  chat_template=CHAT)
    tok.save_pretrained(directory)
    make_model("llama", vocab_size=len(tok), max_position_embeddings=512, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id).save_pretrained(directory)
    return str(directory)


def _both(name, checkpoint, tmp_path, *args):
    text = open(os.path.join(EXAMPLES, name), encoding="utf-8").read()
    header, body = text.split("# hf-lite drop-in <<<\n", 1)
    assert "Upstream: huggingface/transformers docs/source/en/" in header
    for ours, theirs in IMPORTS:
        body = body.replace(ours, theirs)
    upstream = tmp_path / name
    upstream.write_text(body, encoding="utf-8")
    assert "hf_lite" not in upstream.read_text(encoding="utf-8"), "the imports are the only difference"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    outs = []
    for i, script in enumerate((os.path.join(EXAMPLES, name), str(upstream))):
        argv = [a.replace("{out}", str(tmp_path / f"out{i}")) for a in args]
        proc = subprocess.run([sys.executable, script, checkpoint, *argv], capture_output=True, text=True, env=env,
                              timeout=400)
        assert proc.returncode == 0, f"{script}:\n{proc.stderr[-4000:]}"
        outs.append(proc.stdout)
    return outs


def test_pipeline_tutorial_text_generation_blocks_print_what_transformers_prints(checkpoint, tmp_path):
    ours, theirs = _both("pipeline_tutorial.py", checkpoint, tmp_path)
    assert ours == theirs
    lines = ours.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["one_prompt", "list_of_prompts", "batch_inference",
                                                         "task_specific_parameters", "generator_input"]
    assert lines[3].count("generated_text") == 4, "num_return_sequences=4"


def test_chat_templating_pipeline_part_prints_what_transformers_prints(checkpoint, tmp_path):
    ours, theirs = _both("chat_templating_pipeline.py", checkpoint, tmp_path)
    assert ours == theirs
    assert '"role": "assistant"' in ours.splitlines()[-1] and ours.splitlines()[-1].count('"role": "user"') == 2


def test_training_page_trains_evaluates_and_logs_what_transformers_logs(checkpoint, tmp_path):
    import json

    from hf_lite_testing import stdlib_texts

    paragraphs = [p for text in stdlib_texts(6) for p in text.split("\n\n") if p.strip()][:130]
    data = tmp_path / "horoscope.jsonl"
    data.write_text("".join(json.dumps({"horoscope": p}) + "\n" for p in paragraphs), encoding="utf-8")
    ours, theirs = _both("training.py", checkpoint, tmp_path, str(data), "{out}")
    # the last two lines are the script's JSON (before them: the Trainers' own log lines)
    ours, theirs = [[json.loads(line) for line in out.splitlines()[-2:]] for out in (ours, theirs)]
    assert [sorted(h) for h in ours[0]] == [sorted(h) for h in theirs[0]]
    for mine, reference in zip([*ours[0], ours[1]], [*theirs[0], theirs[1]]):
        assert mine == reference
    history = ours[0]
    assert [h["epoch"] for h in history if "eval_loss" in h] == [1.0, 2.0, 3.0], "an evaluation per epoch"
    assert any("loss" in h for h in history), f"logging_steps=10 logged the training loss: {history}"
