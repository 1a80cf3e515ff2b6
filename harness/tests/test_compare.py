"""``miniframes-compare`` in reduced form (a tiny model, 1 warm-up + 1 measured step per strategy, 2 ranks): the
report has every section, the instrumented process group's byte counts equal the formulas exactly, and the
memory counts equal the formulas and each package's own accounting."""

from __future__ import annotations

import json

import pytest
from harness.pipelines.compare import formulas
from harness.pipelines.compare.cli import main
from harness.pipelines.compare.comm import CommCounter
from harness.pipelines.compare.memory import ActivationMeter, tensor_bytes

ARGS = ["--steps", "1", "--warmup", "2", "--hidden-size", "32", "--layers", "2", "--heads", "2", "--vocab-size",
        "96", "--seq-length", "16", "--micro-batch-size", "2", "--requests", "6", "--max-tokens", "4",
        "--batch-size", "3", "--kv-budget", "256", "--repeats", "1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    assert main(["--out", str(out), *ARGS]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_the_report_has_every_section(run):
    out, _ = run
    text = (out / "report.md").read_text()
    for section in ("memory per rank", "communication per step", "step time", "seed's training table",
                    "## Inference", "TensorRT-LLM and TGI", "Command: `miniframes-compare"):
        assert section in text, section
    for png in ("memory_per_rank.png", "communication.png"):
        assert (out / png).stat().st_size > 1000
    for name in ("torch DDP", "pt-dist DDP", "pt-dist FSDP", "torch FSDP2", "ZeRO-1", "ZeRO-2", "ZeRO-3",
                 "CPU offload", "DeepSpeed ZeRO-2", "DeepSpeed ZeRO-3", "mega-par TP", "TP + SP", "PP (1F1B)"):
        assert name in text, name


@pytest.mark.parametrize("name", ["torch-ddp", "pt-dist-ddp", "zero-1", "zero-2", "zero-3", "pt-dist-fsdp",
                                  "torch-fsdp2", "tp"])
def test_byte_counts_equal_the_formulas_exactly(run, name):
    r = run[1]["training"][name]
    assert r["exact_check"] == "equal", r["exact_check"]


def test_volumes_are_the_papers(run):
    t = run[1]["training"]
    psi_bytes = 4 * t["pt-dist-ddp"]["num_params"]
    assert t["pt-dist-ddp"]["comm"]["volume_bytes"] == 2 * psi_bytes  # DDP: 2 Psi
    for stage in ("zero-1", "zero-2"):  # reduce-scatter + all-gather: 2 Psi (+ the grad norm's fp32)
        assert t[stage]["comm"]["volume_bytes"] == 2 * psi_bytes + 8
    # ZeRO-3: 2 Psi, not the paper's 3: stage3_max_reuse_distance keeps forward's gathers for backward
    assert t["zero-3"]["comm"]["volume_bytes"] == 2 * psi_bytes + 8
    tp = t["tp"]["comm"]["by_op"]["all_reduce"]["sizes"]
    bsh = 2 * 2 * 16 * 32 * 4  # global batch x seq x hidden, fp32
    assert tp[str(bsh)] == 4 * 2 + 2  # 4 per layer, the embedding's and the output layer's


def test_memory_counts_equal_the_formulas_and_the_packages_own(run):
    t = run[1]["training"]
    psi, n = t["pt-dist-ddp"]["num_params"], 2
    ddp = t["pt-dist-ddp"]["memory"]
    assert ddp["parameters"] == ddp["gradients"] == 4 * psi
    assert 8 * psi <= ddp["optimizer_states"] <= 8 * psi + 4 * 64  # exp_avg, exp_avg_sq (+ a step scalar each)
    assert t["torch-ddp"]["memory"] == ddp
    for name in ("pt-dist-fsdp", "torch-fsdp2"):
        m = t[name]["memory"]
        assert m["parameters"] == m["gradients"] == 4 * psi // n, name
    for stage in (1, 2, 3):  # ds-zero's memory_breakdown, the paper's split with p = g = 4, K = 12
        m, f = t[f"zero-{stage}"]["memory"], formulas.zero_memory(psi, n, stage, p=4, g=4, k=12)
        assert {k: m[k] for k in f} == f, stage
    off = t["zero-2-offload"]["memory"]
    assert off["optimizer_states"] == 0 and off["offload"] > 0
    tp = t["tp"]["memory"]
    assert tp["parameters"] < ddp["parameters"] * 0.6 and tp["gradients"] == tp["parameters"]
    assert t["pp"]["memory"]["activations"] < ddp["activations"]


def test_bad_arguments_fail_in_one_line(capsys):
    for argv, message in ((["--strategies", "zero-9"], "unknown"), (["--nproc", "1"], "--nproc"),
                          (["--heads", "3"], "--heads 3")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_the_counter_wraps_torch_collectives_under_both_names_and_restores_them():
    import torch.distributed as dist

    real = dist.all_reduce
    counter = CommCounter(1)
    with counter:
        assert dist.all_reduce is not real and dist.distributed_c10d.isend is dist.isend
        assert dist.isend.__name__ == "isend"  # batch_isend_irecv's P2POp check and the payload rule need it
    assert dist.all_reduce is real and dist.distributed_c10d.isend is dist.isend


def test_the_activation_meter_counts_saved_tensors_not_parameters():
    import torch

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64)
    meter = ActivationMeter()
    with meter:
        y = torch.relu(lin(x))
        lin(y).sum().backward()
    assert meter.peak == 2 * 8 * 64 * 4 and meter.live == 0  # x and relu's output; weight.t() is a parameter
    assert tensor_bytes([x, x.view(8, 64), x[2:6], lin.weight]) == 8 * 64 * 4 + 64 * 64 * 4  # views count once
    assert tensor_bytes([x[:2], x[4:]]) == 6 * 64 * 4
