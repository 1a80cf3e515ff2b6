"""``add_config_arguments`` and ``initialize(args=...)``: DeepSpeed's tests/unit/launcher/test_ds_arguments.py cases
(the parser ones; core binding is the launcher's, which refuses it), rewritten for ds_zero and checked against
DeepSpeed's own parser on the same argument lists."""

import argparse
import types

import ds_zero
import pytest
import torch

CASES = [
    ["--num_epochs", "2"],
    ["--num_epochs", "2", "--deepspeed_config", "foo.json"],
    ["--num_epochs", "2", "--deepspeed"],
    ["--num_epochs", "2", "--deepspeed", "--deepspeed_config", "foo.json"],
    ["--num_epochs", "2", "--deepscale", "--deepscale_config", "old.json"],
]


def basic_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_epochs", type=int)
    return parser


@pytest.mark.parametrize("argv", CASES)
def test_parsed_arguments_equal_deepspeeds(argv):
    deepspeed = pytest.importorskip("deepspeed")
    ours = vars(ds_zero.add_config_arguments(basic_parser()).parse_args(argv))
    theirs = vars(deepspeed.add_config_arguments(basic_parser()).parse_args(argv))
    assert ours == theirs
    assert ours["num_epochs"] == 2 and isinstance(ours["deepspeed"], bool)


def test_no_ds_parser_refuses_the_flags():
    with pytest.raises(SystemExit):
        basic_parser().parse_args(["--num_epochs", "2", "--deepspeed"])
    assert not hasattr(basic_parser().parse_args(["--num_epochs", "2"]), "deepspeed_config")


def test_initialize_reads_the_config_from_args_and_refuses_two_configs(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}')
    args = ds_zero.add_config_arguments(basic_parser()).parse_args(["--deepscale_config", str(path)])
    assert ds_zero.config_from_args(args) == str(path)
    both = types.SimpleNamespace(deepspeed_config=str(path), deepscale_config=str(path))
    with pytest.raises(ValueError, match="both --deepspeed_config"):
        ds_zero.config_from_args(both)
    args = types.SimpleNamespace(deepspeed_config=str(path))
    with pytest.raises(ValueError, match="a config was given both to initialize"):
        ds_zero.initialize(args=args, model=torch.nn.Linear(2, 2), config={"train_batch_size": 1})


def test_subpackages_are_reachable_after_import_as_in_deepspeed():
    """``deepspeed.checkpointing.checkpoint(...)`` right after ``import deepspeed``: the same for ds_zero's
    ``checkpointing``, ``zero``, ``pipe``, ``runtime``, ``ops`` and ``utils`` (a fresh interpreter, so no other test
    has imported them)."""
    import subprocess
    import sys

    names = ["checkpointing.checkpoint", "zero.Init", "zero.GatheredParameters", "pipe.PipelineModule",
             "runtime.utils.set_random_seed", "utils.RepeatingLoader", "ops.adam.DeepSpeedCPUAdam",
             "init_distributed", "add_config_arguments", "PipelineModule"]
    # One interpreter for both: ds_zero first (it imports no deepspeed), then deepspeed; each name is looked up
    # right after its own package's import, before anything else could have imported its subpackages.
    code = ("import functools, importlib, sys\n"
            "for lib in ('ds_zero', 'deepspeed'):\n"
            "    mod = importlib.import_module(lib)\n"
            "    for n in sys.argv[1:]:\n"
            "        try:\n"
            "            functools.reduce(getattr, n.split('.'), mod)\n"
            "        except AttributeError as e:\n"
            "            sys.exit(f'{lib}.{n}: {e}')\n"
            "    print('REACHED', lib)\n")
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n").count("REACHED ds_zero") == 1 and "REACHED deepspeed" in proc.stdout
