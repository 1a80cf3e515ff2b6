"""vLLM's own example scripts (``packages/paged-serve/examples/``) run on paged-serve with only their import lines
and model path changed, on a tiny local checkpoint; what they print is checked (greedy: against transformers).

Each file's header names the upstream path, commit and sha256 and lists every changed line; the first test undoes
those lines and checks the sha256, so the diff against upstream is exactly what the header says.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from paged_serve import LLM, SamplingParams

from .conftest import build_checkpoint

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = ["basic.py", "llm_engine_example.py", "openai_completion_client.py", "openai_chat_completion_client.py"]
ENV = {**os.environ, "TRITON_INTERPRET": "1", "TOKENIZERS_PARALLELISM": "false"}


def _upstream(path: Path) -> tuple[str, str]:
    """(the upstream text rebuilt from the file and its header, the sha256 the header records)."""
    text = path.read_text()
    header, body = text.split("# end of miniframes header\n", 1)
    lines = header.splitlines()
    sha = next(line.split(": ", 1)[1] for line in lines if line.startswith("# upstream sha256: "))
    minus = [line[len("#   - ") :] for line in lines if line.startswith("#   - ")]
    plus = [line[len("#   + ") :] for line in lines if line.startswith("#   + ")]
    for old, new in zip(minus, plus):
        assert body.count(new + "\n") == 1, new
        body = body.replace(new + "\n", old + "\n")
    return body, sha


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_example_differs_from_upstream_only_where_its_header_says(name):
    body, sha = _upstream(EXAMPLES / name)
    assert hashlib.sha256(body.encode()).hexdigest() == sha
    changed = [line for line in (EXAMPLES / name).read_text().splitlines() if line.startswith("#   + ")]
    assert all("paged_serve" in line or "tiny-llama" in line for line in changed)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory holding the checkpoint as ./tiny-llama (vLLM's basic.py loads its model by that path)."""
    root = tmp_path_factory.mktemp("examples")
    model = build_checkpoint(root / "tiny-llama", max_position_embeddings=512)
    return root, model


def _run(args, cwd, timeout=120):
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_basic_py_prints_what_llm_generate_gives(workdir):
    root, _ = workdir
    out = _run([str(EXAMPLES / "basic.py")], root)
    printed = re.findall(r"^Prompt: (.*), Generated text: (.*)$", out, re.M)
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]  # fmt: skip
    assert [ast.literal_eval(p) for p, _ in printed] == prompts
    llm = LLM(str(root / "tiny-llama"), max_model_len=512, max_num_seqs=16)  # the same engine, same seed
    want = [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(), use_tqdm=False)]
    assert [ast.literal_eval(t) for _, t in printed] == want


def test_llm_engine_example_greedy_request_equals_transformers(workdir):
    root, hf = workdir
    out = _run([str(EXAMPLES / "llm_engine_example.py"), "--model", "tiny-llama", "--max_num_seqs", "16"], root)
    finished = {m.group(1): m.group(0) for m in re.finditer(r"^RequestOutput\(request_id='(\d+)'.*$", out, re.M)}
    assert sorted(finished) == ["0", "1", "2"]
    first_output = finished["0"].split("outputs=")[1]
    tokens = [int(t) for t in re.search(r"token_ids=\[([\d, ]*)\]", first_output).group(1).split(",")]
    tok = LLM(str(root / "tiny-llama"), num_gpu_blocks=64).get_tokenizer()
    ids = tok.encode("A robot may not injure a human being")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0, len(ids) :]
    eos = ref.tolist().index(1) + 1 if 1 in ref.tolist() else len(ref)
    assert tokens == ref.tolist()[:eos]
    assert "prompt_logprobs=[None, {" in finished["0"]  # prompt_logprobs=1 was asked for
    assert finished["2"].count("CompletionOutput(index=") == 2  # n=2 of best_of=5


def test_openai_client_examples_against_paged_serve_serve(workdir):
    root, _ = workdir
    cmd = [sys.executable, "-m", "paged_serve.entrypoints.cli", "serve", "tiny-llama", "--port", "8000",
           "--num-gpu-blocks", "256", "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(cmd, cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get("http://localhost:8000/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.2)
        out = _run([str(EXAMPLES / "openai_completion_client.py")], root)
        chunks = [line for line in out.splitlines() if line.startswith("Completion(")]
        assert out.startswith("Completion results:") and len(chunks) >= 2
        assert "model='tiny-llama'" in chunks[0] and "finish_reason='length'" in chunks[-1]
        out = _run([str(EXAMPLES / "openai_chat_completion_client.py")], root)
        assert "Chat completion results:" in out and "ChatCompletion(id='chatcmpl-" in out
        assert re.search(r"finish_reason='(stop|length)'", out) and "role='assistant'" in out
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=30)
    assert rc == 0
