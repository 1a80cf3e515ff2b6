"""DeepSpeed's own scripts (``examples/``), run unchanged but for their import line, side by side with the same
file under DeepSpeed: the same ranks (2, gloo), the same config, the same printed losses.

Each DeepSpeed-side file is rebuilt from the drop-in by swapping its import lines back, and the rebuilt file's
other changes (listed in its header) are swapped back too and checked against the upstream file's sha256, so the
diff is exactly what the header says. The configs are the examples' own with two test-only edits: fp16 off (CPU)
and ``"torch_adam": true``, so DeepSpeed uses torch's Adam instead of JIT-compiling its fused one (minutes).
"""

import contextlib
import hashlib
import io
import json
import pathlib
import runpy
import sys

import pytest
import torch
from ds_zero.runtime.zero.partition_parameters import default_half_dtype

from harness import run_ranks

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
pytest.importorskip("deepspeed")


def _deepspeed_source(path: pathlib.Path, imports: list[tuple[str, str]]) -> str:
    """The file with its import lines swapped back (in the body; the header block stays)."""
    header, body = path.read_text().split("# ds-zero drop-in <<<\n", 1)
    assert "# ds-zero drop-in >>>" in header
    for ours, theirs in imports:
        assert body.count(ours) == 1, f"{path.name}: {ours!r} should appear once"
        body = body.replace(ours, theirs)
    assert "ds_zero" not in body, f"{path.name}: ds_zero appears outside the import lines"
    return header + "# ds-zero drop-in <<<\n" + body


def _run_script(rank, world, script, argv):
    """Run ``script`` as ``__main__`` with ``argv`` in this rank; rank 0's stdout comes back."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [script, *argv]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue() if rank == 0 else None


def _runs(rank, world, plan):
    """Fresh rank processes (``fresh=True``): DeepSpeed keeps process-wide state (its comm backend, groups, mpu)
    that a pooled rank would carry over from another test's DeepSpeed engine."""
    import deepspeed.ops
    import torch

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain torch.distributed, no C++ build
    torch.set_num_threads(1)
    return [_run_script(rank, world, script, argv) for script, argv in plan]


def _step_losses(stdout: str) -> list[float]:
    """getting_started.py's ``step N loss X global_steps M`` lines: the losses."""
    return [float(line.split()[3]) for line in stdout.splitlines() if line.startswith("step ")]


def _losses(stdout: str, prefix: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------- docs/_tutorials/getting-started.md
def test_getting_started_trains_saves_and_resumes_as_deepspeed(tmp_path):
    ours = EXAMPLES / "getting_started.py"
    theirs = tmp_path / "getting_started_deepspeed.py"
    theirs.write_text(_deepspeed_source(ours, [("import ds_zero as deepspeed\n", "import deepspeed\n")]))
    cfg = json.loads((EXAMPLES / "ds_config.json").read_text())
    assert cfg["zero_optimization"] is True  # the page's legacy boolean: stage 1
    cfg["fp16"]["enabled"] = False
    cfg["optimizer"]["params"]["torch_adam"] = True
    (tmp_path / "ds_config.json").write_text(json.dumps(cfg))
    plan = []
    for script in (theirs, ours):
        common = ["--deepspeed", "--deepspeed_config", str(tmp_path / "ds_config.json")]
        ckpt = str(tmp_path / f"ckpt_{script.stem}")
        plan += [(str(script), [*common, "--steps", "10"]),
                 (str(script), [*common, "--steps", "5", "--save_dir", ckpt]),
                 (str(script), [*common, "--load_dir", ckpt])]
    out = run_ranks(_runs, 1, plan, timeout=300, fresh=True)[0]  # one rank: see the header (tags are rank losses)
    t_full, t_first, t_resumed, o_full, o_first, o_resumed = (_step_losses(s) for s in out)
    assert len(t_full) == 10 and o_full == pytest.approx(t_full, rel=1e-5)
    assert o_first == pytest.approx(t_first, rel=1e-5) and t_first == t_full[:5]
    # saved at steps 1, 2 and 4 (`step % save_interval`), so the resumed run trains batches 5-9 as the full run
    assert len(t_resumed) == 5 and o_resumed == pytest.approx(t_resumed, rel=1e-5)
    assert o_resumed == pytest.approx(o_full[5:], rel=1e-6) and t_resumed == pytest.approx(t_full[5:], rel=1e-6)
    tags = (tmp_path / "ckpt_getting_started" / "latest").read_text(), (
        tmp_path / "ckpt_getting_started_deepspeed" / "latest").read_text()
    assert tags[0] == tags[1]  # the tag is the loss at step 4, as DeepSpeed names it


# ---------------------------------------------------------------- DeepSpeedExamples pipeline_parallelism/train.py
PIPE_UPSTREAM_SHA256 = "2ec3c7af233af4ec212bee697f52d1be23959a184c55204f3de17e3947aa514d"
PIPE_IMPORTS = [
    ("import ds_zero as deepspeed\n", "import deepspeed\n"),
    ("from ds_zero.pipe import PipelineModule\n", "from deepspeed.pipe import PipelineModule\n"),
    ("from ds_zero.utils import RepeatingLoader\n", "from deepspeed.utils import RepeatingLoader\n"),
]
PIPE_OTHER = [  # (here, upstream): the header's non-import changes
    ("""    trainset = torchvision.datasets.FakeData(size=512, image_size=(3, 32, 32), num_classes=10,
                                             transform=transform)
""", """    trainset = torchvision.datasets.CIFAR10(root=dl_path,
                                            train=True,
                                            download=True,
                                            transform=transform)
"""),
    ("    if torch.cuda.is_available():\n        torch.cuda.set_device(args.local_rank)\n",
     "    torch.cuda.set_device(args.local_rank)\n"),
]


def test_pipeline_example_is_upstream_but_for_the_listed_lines():
    text = _deepspeed_source(EXAMPLES / "pipeline_parallelism" / "train.py", PIPE_IMPORTS)
    head, rest = text.split("# ds-zero drop-in >>>\n", 1)
    text = head + rest.split("# ds-zero drop-in <<<\n", 1)[1]
    for here, upstream in PIPE_OTHER:
        assert text.count(here) == 1
        text = text.replace(here, upstream)
    assert hashlib.sha256(text.encode()).hexdigest() == PIPE_UPSTREAM_SHA256


def test_pipeline_example_trains_as_under_deepspeed(tmp_path):
    """2 stages of torchvision's AlexNet, 4 micro-batches of 2 per step. The upstream config's lr (1e-3) makes
    the loss jump to 5.7 at step 2, where float rounding differences between two correct runs grow to the printed
    digits by step 3; at 1e-5 the runs stay comparable to the 4 decimals DeepSpeed prints."""
    pytest.importorskip("torchvision")
    ours = EXAMPLES / "pipeline_parallelism" / "train.py"
    theirs = tmp_path / "train_deepspeed.py"
    theirs.write_text(_deepspeed_source(ours, PIPE_IMPORTS))
    cfg = json.loads((ours.parent / "ds_config.json").read_text())
    cfg.update(train_batch_size=8, train_micro_batch_size_per_gpu=2, steps_per_print=1)
    cfg["optimizer"]["params"].update(lr=1e-5, torch_adam=True)
    (tmp_path / "ds_config.json").write_text(json.dumps(cfg))
    argv = ["--deepspeed_config", str(tmp_path / "ds_config.json"), "-p", "2", "--steps", "2", "--backend", "gloo"]
    t_out, o_out = run_ranks(_runs, 2, [(str(theirs), argv), (str(ours), argv)], timeout=300, fresh=True)[0]
    strip = lambda lines: [ln.split(" iter time")[0] for ln in lines]  # noqa: E731
    theirs_lines, ours_lines = strip(_losses(t_out, "steps: ")), strip(_losses(o_out, "steps: "))
    assert len(theirs_lines) == 2 and ours_lines == theirs_lines


# ---------------------------------------------------------------- docs/_tutorials/zero.md: Init, GatheredParameters
def test_zero3_init_and_gathered_parameters_train_as_under_deepspeed(tmp_path):
    """The model is built partitioned (zero.Init, remote_device="cpu"), its embeddings initialised on rank 0 inside
    GatheredParameters(modifier_rank=0), then trained with the page's ZeRO-Infinity block (CPU offload of
    parameters and optimizer). Test-only config edits besides torch_adam: zero_force_ds_cpu_optimizer false (which
    DeepSpeed needs to offload with torch's Adam) and a persistence threshold of 10 elements, so that this small
    model's parameters are really partitioned (the page's 1e5 keeps all of them whole), and the half precision
    zero.Init builds in without a config (DeepSpeed's Init._set_dtype: fp16 where the CPU has oneDNN fp16 kernels,
    else bf16) turned on, so the engine trains in it too, as the tutorial's fp16 configs do on GPUs."""
    ours = EXAMPLES / "zero3_init.py"
    theirs = tmp_path / "zero3_init_deepspeed.py"
    theirs.write_text(_deepspeed_source(ours, [("import ds_zero as deepspeed\n", "import deepspeed\n")]))
    cfg = json.loads((EXAMPLES / "zero3_config.json").read_text())
    cfg["optimizer"]["params"]["torch_adam"] = True
    cfg["zero_force_ds_cpu_optimizer"] = False
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 10
    half = "fp16" if default_half_dtype() == torch.float16 else "bf16"
    cfg[half] = {"enabled": True}  # zero.Init without a config builds in the accelerator's half precision
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    argv = ["--deepspeed_config", str(tmp_path / "cfg.json"), "--remote_device", "cpu", "--steps", "4"]
    t_out, o_out = run_ranks(_runs, 2, [(str(theirs), argv), (str(ours), argv)], timeout=300, fresh=True)[0]

    def values(out, prefix):
        return [float(ln.split()[-1]) for ln in out.splitlines() if ln.startswith(prefix)]

    # rank 0's initialisation in GatheredParameters(modifier_rank=0) reaches every partition: exactly equal
    assert values(o_out, "position_embeddings initialised") == values(t_out, "position_embeddings initialised")
    # half-precision training: the tolerance of test_deepspeed_parity.py's bf16 case (one bf16 ulp in a step's gradient
    # moves an Adam update by up to lr)
    assert len(values(t_out, "step ")) == 4
    assert values(o_out, "step ") == pytest.approx(values(t_out, "step "), rel=2e-2, abs=1e-3)
    assert values(o_out, "position_embeddings trained") == pytest.approx(
        values(t_out, "position_embeddings trained"), rel=5e-2
    )


# ---------------------------------------------------------------- DeepSpeedExamples training/cifar/cifar10_deepspeed.py
CIFAR = EXAMPLES / "cifar" / "cifar10_deepspeed.py"
CIFAR_UPSTREAM_SHA256 = "4ae71cfb528a3b91b8f95eddeb0787eba98db2b4b5b48631f5248f6765234666"
CIFAR_IMPORTS = [
    ("import ds_zero as deepspeed\n", "import deepspeed\n"),
    ("from ds_zero.accelerator import get_accelerator\n", "from deepspeed.accelerator import get_accelerator\n"),
    ("from ds_zero.moe.utils import", "from deepspeed.moe.utils import"),
]
CIFAR_OTHER = [  # (here, upstream): the header's non-import changes
    ("""    trainset = torchvision.datasets.FakeData(
        size=256, image_size=(3, 32, 32), num_classes=10, transform=transform
    )
    testset = torchvision.datasets.FakeData(
        size=100, image_size=(3, 32, 32), num_classes=10, transform=transform, random_offset=256
    )
""", """    trainset = torchvision.datasets.CIFAR10(
        root="./data", train=True, download=True, transform=transform
    )
    testset = torchvision.datasets.CIFAR10(
        root="./data", train=False, download=True, transform=transform
    )
"""),
    ("    torch.manual_seed(0)\n    net = Net(args)\n", "    net = Net(args)\n"),
]


def _runs_torch_adam(rank, world, plan):
    """``_runs`` with the config the script builds in code given ``"torch_adam": true`` on its way into either
    library's ``initialize`` (the test-only edit of the header above: DeepSpeed would JIT-compile its fused CPU
    Adam otherwise, minutes)."""
    import functools

    import deepspeed
    import ds_zero

    def with_torch_adam(init, *args, config=None, **kwargs):
        config = json.loads(json.dumps(config))
        config["optimizer"]["params"]["torch_adam"] = True
        return init(*args, config=config, **kwargs)

    saved = deepspeed.initialize, ds_zero.initialize
    deepspeed.initialize = functools.partial(with_torch_adam, saved[0])
    ds_zero.initialize = functools.partial(with_torch_adam, saved[1])
    try:
        return _runs(rank, world, plan)
    finally:
        deepspeed.initialize, ds_zero.initialize = saved


def test_cifar_example_is_upstream_but_for_the_listed_lines():
    text = _deepspeed_source(CIFAR, CIFAR_IMPORTS)
    head, rest = text.split("# ds-zero drop-in >>>\n", 1)
    text = head + rest.split("# ds-zero drop-in <<<\n", 1)[1]
    for here, upstream in CIFAR_OTHER:
        assert text.count(here) == 1
        text = text.replace(here, upstream)
    # upstream's line ends are CRLF; the copy here has LF
    assert hashlib.sha256(text.replace("\n", "\r\n").encode()).hexdigest() == CIFAR_UPSTREAM_SHA256


def test_cifar_example_trains_at_zero_stages_0_and_3_as_under_deepspeed(tmp_path):
    """The script's own config (Adam, WarmupLR, clipping 1.0, overlap_comm, its 5e7 buckets), fp32, one epoch of
    256 FakeData images on 2 ranks: 16 steps, each step's loss printed (``--log-interval 1``), then the test-set
    accuracy lines. The printed losses and accuracies equal DeepSpeed's at stages 0 and 3; stages 1 and 2 are checked
    against DeepSpeed in test_deepspeed_parity and test_engine_attributes, and two stages here keep the suite short."""
    stages = (0, 3)
    pytest.importorskip("torchvision")
    theirs = tmp_path / "cifar10_deepspeed_ds.py"
    theirs.write_text(_deepspeed_source(CIFAR, CIFAR_IMPORTS))
    plan = []
    for stage in stages:
        argv = ["--dtype", "fp32", "--stage", str(stage), "-e", "1", "--log-interval", "1"]
        plan += [(str(theirs), argv), (str(CIFAR), argv)]
    outs = run_ranks(_runs_torch_adam, 2, plan, timeout=600, fresh=True)[0]
    for stage, (t_out, o_out) in zip(stages, zip(outs[::2], outs[1::2])):
        t_losses, o_losses = _losses(t_out, "[ 1,"), _losses(o_out, "[ 1,")
        assert len(t_losses) == 16 and o_losses == t_losses, (stage, o_losses, t_losses)
        assert _losses(o_out, "Accuracy") == _losses(t_out, "Accuracy") and len(_losses(t_out, "Accuracy")) == 11


def test_cifar_example_refuses_the_moe_layer_by_name():
    """``--moe`` builds ``deepspeed.moe.layer.MoE``: ds_zero does not build it, and says so at construction."""
    import ds_zero

    with pytest.raises(NotImplementedError, match=r"deepspeed\.moe\.layer\.MoE\(hidden_size=84, num_experts=2"):
        ds_zero.moe.layer.MoE(hidden_size=84, expert=torch.nn.Linear(84, 84), num_experts=2, ep_size=1, k=1)
