"""The ``ds-zero`` launcher against DeepSpeed's ``deepspeed`` runner (``deepspeed/launcher/runner.py``).

Hostfile parsing and the ``--include``/``--exclude`` filters run side by side with DeepSpeed's own
functions on the same inputs (upstream's cases: ``tests/unit/launcher/test_run.py``); ``--help``
is checked against DeepSpeed's flag list. One real 2-process launch goes through the installed
console script; the exit-status, module and plan tests call ``runner.main`` in this process.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ds_zero._compat.launcher import runner  # its run_torchrun is patched where main looks it up
from ds_zero.launcher import hostfile as hf

ds_runner = pytest.importorskip("deepspeed.launcher.runner")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ds_or_error(fn, *args):
    """The function's result, or the exception type it raised (both sides must agree on which)."""
    try:
        return fn(*args)
    except ValueError:
        return ValueError


@pytest.fixture
def clean_env(monkeypatch):
    # run_torchrun sets CUDA_VISIBLE_DEVICES and torchrun sets OMP_NUM_THREADS in os.environ: restore both.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# --- hostfile, side by side with DeepSpeed -----------------------------------------------------------

HOSTFILES = {
    "plain": ["worker-0 slots=16\n", "worker-1 slots=16\n"],
    "comments_blank": ["# the pool\n", "\n", "   \n", "worker-0 slots=4 # four\n", "\n", "  worker-1   slots=2  \n"],
    "trailing_text": ["worker-0 slots=8 max_slots=8\n"],
    "zero_slots": ["worker-0 slots=0\n", "worker-1 slots=1\n"],
    "duplicate_host": ["worker-0 slots=4\n", "worker-1 slots=4\n", "worker-0 slots=2\n"],
    "bad_line": ["worker-0 slots=4\n", "worker-1 slots:4\n"],
    "no_slots": ["worker-0\n"],
    "only_comments": ["# nothing\n", "\n"],
}


@pytest.mark.parametrize("name", list(HOSTFILES))
def test_parse_hostfile_matches_deepspeed(name):
    lines = HOSTFILES[name]
    ours, theirs = ds_or_error(hf.parse_hostfile, lines), ds_or_error(ds_runner._parse_hostfile, lines)
    assert ours == theirs
    if theirs is not ValueError:
        assert list(ours) == list(theirs)  # host order is rank order


def test_fetch_hostfile_matches_deepspeed(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("".join(HOSTFILES["comments_blank"]))
    assert hf.fetch_hostfile(str(path)) == ds_runner.fetch_hostfile(str(path)) == {"worker-0": 4, "worker-1": 2}
    missing = str(tmp_path / "absent")
    assert hf.fetch_hostfile(missing) is None and ds_runner.fetch_hostfile(missing) is None


def test_bad_hostfile_errors_name_the_line():
    with pytest.raises(ValueError, match=r"line 2: bad entry 'worker-1 slots:4'"):
        hf.parse_hostfile(HOSTFILES["bad_line"])
    with pytest.raises(ValueError, match=r"line 3: host 'worker-0' appears more than once"):
        hf.parse_hostfile(HOSTFILES["duplicate_host"])


# --- include / exclude, side by side with DeepSpeed ------------------------------------------------

POOL = {"worker-0": 4, "worker-1": 4, "worker-2": 2}
FILTERS = [
    ("", ""),
    ("worker-0", ""),
    ("worker-1:0,2", ""),
    ("worker-0@worker-1:0,2", ""),
    ("worker-2@worker-0:3", ""),          # result keeps the hostfile's order, not the filter's
    ("worker-1:2,0@worker-1:1", ""),      # a host twice: slots merged, sorted
    ("worker-1:1,1", ""),
    ("", "worker-1:0"),
    ("", "worker-0"),
    ("", "worker-2:0,1"),                 # every slot excluded: the host goes
    ("", "worker-0@worker-2:1"),
    ("nohost", ""),
    ("worker-0:7", ""),
    ("", "nohost:0"),
    ("", "worker-2:5"),
    ("worker-0", "worker-1"),             # mutually exclusive
]


@pytest.mark.parametrize("include,exclude", FILTERS)
def test_parse_inclusion_exclusion_matches_deepspeed(include, exclude):
    ours = ds_or_error(hf.parse_inclusion_exclusion, POOL, include, exclude)
    theirs = ds_or_error(ds_runner.parse_inclusion_exclusion, POOL, include, exclude)
    assert ours == theirs
    if theirs is not ValueError:
        assert list(ours) == list(theirs)


def test_filters_are_not_vacuous():
    assert hf.parse_inclusion_exclusion(POOL, "worker-0@worker-1:0,2", "") == {"worker-0": [0, 1, 2, 3],
                                                                               "worker-1": [0, 2]}
    assert hf.parse_inclusion_exclusion(POOL, "", "worker-0@worker-2:1") == {"worker-1": [0, 1, 2, 3],
                                                                             "worker-2": [0]}


@pytest.mark.parametrize("num_nodes,num_gpus", [(-1, -1), (1, -1), (2, 3), (5, 1), (-1, 8)])
def test_apply_num_nodes_and_gpus_matches_deepspeed(num_nodes, num_gpus):
    active = hf.parse_inclusion_exclusion(POOL, "", "")
    assert (hf.apply_num_nodes_and_gpus(active, num_nodes, num_gpus)
            == ds_runner.apply_num_nodes_and_gpus(active, num_nodes, num_gpus))


# --- --help ------------------------------------------------------------------------------------------

def flags_in_help(text: str) -> set[str]:
    """The option strings of argparse's option lines ("  -H HOSTFILE, --hostfile HOSTFILE   help...")."""
    flags = set()
    for line in text.splitlines():
        match = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if match:
            flags |= set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", match.group(1)))
    return flags


def test_help_lists_every_deepspeed_flag(capsys):
    with pytest.raises(SystemExit) as ours:
        runner.main(["--help"])
    assert ours.value.code == 0
    our_help = capsys.readouterr().out
    with pytest.raises(SystemExit):
        ds_runner.parse_args(["--help"])
    ds_flags = flags_in_help(capsys.readouterr().out)
    assert {"--hostfile", "--include", "--num_gpus", "--no_local_rank", "--launcher"} <= ds_flags
    assert ds_flags <= flags_in_help(our_help)
    assert our_help.startswith("usage: ds-zero")


# --- errors: exit 2, naming the value, before anything starts ----------------------------------------

@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("launched despite bad input")
    monkeypatch.setattr(runner, "run_torchrun", refuse)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


@pytest.fixture
def two_hosts(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=2\nworker-1 slots=3\n")
    return str(path)


def error_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        runner.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: ds-zero" in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv,message", [
    (["missing.py"], "training script not found: missing.py"),
    (["--num_gpus", "0", "{script}"], "--num_gpus 0: must be at least 1"),
    (["--num_gpus", "-1", "{script}"], "--num_gpus -1: must be at least 1"),
    (["--num_nodes", "0", "{script}"], "--num_nodes 0: must be at least 1"),
    (["--num_nodes", "2", "{script}"], "--num_nodes 2: no extra nodes without a --hostfile"),
    (["-H", "{hosts}", "-i", "worker-9", "{script}"], "--include worker-9: Hostname 'worker-9' not found"),
    (["-H", "{hosts}", "-i", "worker-1:3", "{script}"], "No slot 3 on host 'worker-1'"),
    (["-H", "{hosts}", "-e", "worker-0:a", "{script}"], "--exclude worker-0:a: bad slot list 'a'"),
    (["-H", "{hosts}", "-i", "worker-0", "-e", "worker-1", "{script}"], "mutually exclusive"),
    (["-H", "{hosts}", "-i", "worker-0", "--num_gpus", "1", "{script}"], "cannot be combined"),
    (["-H", "{bad_hosts}", "{script}"], "bad entry 'worker-1 slots:4'"),
    (["-H", "{dup_hosts}", "{script}"], "host 'worker-0' appears more than once"),
    (["-H", "/nonexistent/hostfile", "{script}"], "--hostfile /nonexistent/hostfile: no such file"),
    (["--node_rank", "1", "{script}"], "--node_rank 1: only used with --no_ssh"),
    (["-H", "{hosts}", "--no_ssh", "--node_rank", "2", "{script}"], "--node_rank 2: must be in [0, 2)"),
    (["--no_ssh", "{script}"], "--no_ssh needs --node_rank"),
    (["--launcher", "openmpi", "{script}"], "--launcher openmpi: not implemented by ds-zero"),
    (["--launcher", "nope", "{script}"], "--launcher nope: unknown launcher"),
    (["--bind_cores_to_rank", "--ssh_port", "22", "{script}"],
     "not implemented by ds-zero: --bind_cores_to_rank, --ssh_port"),
    (["--save_pid", "--enable_each_rank_log", "logs", "--launcher_args=-x", "{script}"],
     "not implemented by ds-zero: --launcher_args, --save_pid, --enable_each_rank_log"),
    (["--autotuning", "tune", "--bind_core_list", "0-3", "--venv_script", "v", "{script}"],
     "not implemented by ds-zero: --autotuning, --bind_core_list, --venv_script"),
    (["--module", "--no_python", "{script}"], "--module and --no_python cannot be used together"),
])
def test_bad_input_exits_2_naming_the_value(argv, message, capsys, no_launch, clean_env, script, two_hosts, tmp_path):
    (tmp_path / "bad").write_text("worker-0 slots=4\nworker-1 slots:4\n")
    (tmp_path / "dup").write_text("worker-0 slots=4\nworker-0 slots=2\n")
    subs = {"script": script, "hosts": two_hosts, "bad_hosts": str(tmp_path / "bad"),
            "dup_hosts": str(tmp_path / "dup")}
    assert message in error_of(capsys, [a.format(**subs) for a in argv])


# --- the plan: what runs here, with which world ------------------------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(runner, "run_torchrun", lambda node, args, log_level: calls.append((node, args)) or 0)
    return calls


def test_no_hostfile_defaults_to_cuda_device_count_or_one(recorded, clean_env, script):
    import torch

    assert runner.main([script]) == 0
    (node, args), = recorded
    assert node.nproc == (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    assert (node.host, node.master_addr, node.master_port) == ("localhost", "127.0.0.1", 29500)


def test_cuda_visible_devices_becomes_the_slots(recorded, clean_env, monkeypatch, script):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # DeepSpeed: --include=localhost:2,3
    assert runner.main([script]) == 0
    assert recorded[0][0].slots == [2, 3] and recorded[0][0].env() == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_single_localhost_hostfile_runs_here(recorded, clean_env, tmp_path, script):
    path = tmp_path / "hostfile"
    path.write_text("# one node\nlocalhost slots=3\n")
    assert runner.main(["-H", str(path), "--master_port", "29123", script, "--x", "1"]) == 0
    (node, args), = recorded
    assert (node.nnodes, node.nproc, node.slots, node.master_addr) == (1, 3, [0, 1, 2], "127.0.0.1")
    assert args[:5] == ["--nnodes=1", "--node-rank=0", "--nproc-per-node=3", "--master-addr=127.0.0.1",
                        "--master-port=29123"]
    assert args[-3:] == [script, "--x", "1"]


def test_no_ssh_runs_this_nodes_share(recorded, clean_env, two_hosts, script):
    assert runner.main(["-H", two_hosts, "--no_ssh", "--node_rank", "1", script]) == 0
    (node, args), = recorded
    assert (node.host, node.node_rank, node.nnodes, node.nproc) == ("worker-1", 1, 2, 3)
    assert (node.first_rank, node.world_size, node.master_addr) == (2, 5, "worker-0")


# --- multi-node: print each node's torchrun command ---------------------------------------------------

def printed_commands(out: str) -> list[tuple[dict[str, str], object]]:
    """Each printed node line as (its environment, torchrun's own parse of its arguments)."""
    import torch.distributed.run as torchrun

    parsed = []
    for line in out.splitlines():
        if line.startswith("cd "):
            words = shlex.split(line.split(" && ", 1)[1])
            at = words.index("torchrun")
            env = dict(w.split("=", 1) for w in words[:at])
            parsed.append((env, torchrun.parse_args(words[at + 1:])))
    return parsed


def test_multi_node_prints_each_nodes_torchrun_command(recorded, clean_env, capsys, tmp_path, script):
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=2\nworker-1 slots=4\nworker-2 slots=4\n")
    argv = ["-H", str(path), "-i", "worker-1:0,2@worker-0", "--master_port", "29777", script,
            "--deepspeed_config", "ds.json"]
    assert runner.main(argv) == 0
    assert recorded == []  # nothing started, no ssh
    out = capsys.readouterr().out
    assert "does not ssh" in out
    assert "# node 0 of 2: worker-0, ranks 0-1" in out and "# node 1 of 2: worker-1, ranks 2-3" in out
    nodes = printed_commands(out)
    assert len(nodes) == 2
    for node_rank, ((env, args), slots) in enumerate(zip(nodes, ["0,1", "0,2"])):
        assert env == {"CUDA_VISIBLE_DEVICES": slots}
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", node_rank, "2")
        assert (args.master_addr, args.master_port) == ("worker-0", 29777)  # the first host, as DeepSpeed's
        assert args.module and args.training_script == "ds_zero.launcher.local_rank"
        assert args.training_script_args == [script, "--deepspeed_config", "ds.json"]


def test_force_multi_prints_a_single_host(recorded, clean_env, capsys, tmp_path, script):
    path = tmp_path / "hostfile"
    path.write_text("localhost slots=2\n")
    assert runner.main(["-H", str(path), "--force_multi", "--no_local_rank", "--master_addr", "10.0.0.1",
                        script]) == 0
    assert recorded == []
    (env, args), = printed_commands(capsys.readouterr().out)
    assert (args.nnodes, args.nproc_per_node, args.master_addr) == ("1", "2", "10.0.0.1")
    assert args.training_script_args == ["--no_local_rank", script]


# --- real launches -------------------------------------------------------------------------------------

RANK_SCRIPT = """\
import argparse, os
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--deepspeed_config")
args = parser.parse_args()
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
print("RANKINFO " + " ".join(f"{k}={v}" for k, v in env.items())
      + f" local_rank_arg={args.local_rank} config={args.deepspeed_config} sum={total.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_two_process_launch_through_the_console_script(tmp_path):
    (tmp_path / "script.py").write_text(RANK_SCRIPT)
    (tmp_path / "cfg.json").write_text(json.dumps({"train_batch_size": 2}))
    exe = Path(sys.executable).with_name("ds-zero")
    assert exe.exists(), "uv sync installs the ds-zero console script"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([str(exe), "--num_gpus", "2", "--master_port", str(port), "script.py",
                           "--deepspeed_config", "cfg.json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # both ranks write to one pipe: a line's newline can land after the other rank's text, so split on the marker
    lines = sorted("RANKINFO " + part.strip().splitlines()[0] for part in proc.stdout.split("RANKINFO")[1:])
    assert lines == [f"RANKINFO RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
                     f"local_rank_arg={r} config=cfg.json sum=3" for r in range(2)]


def launch_here(tmp_path, body: str, *flags: str) -> tuple[int, dict[int, dict]]:
    """runner.main in this process on a 2-rank torch-free script that writes rank<N>.json; (exit code, reports)."""
    (tmp_path / "job.py").write_text("import json, os, sys\n"
                                     "report = {'argv': sys.argv, 'env': dict(os.environ)}\n"
                                     "name = f\"rank{os.environ['RANK']}.json\"\n"
                                     "open(name + '.tmp', 'w').write(json.dumps(report))\n"
                                     "os.replace(name + '.tmp', name)\n"  # whole or absent if torchrun kills it
                                     + body)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        target = "job" if "--module" in flags else "job.py"
        code = runner.main(["-q", "--num_gpus", "2", "--master_port", str(free_port()), *flags, target, "--x", "1"])
    finally:
        os.chdir(cwd)
    reports = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
               if (tmp_path / f"rank{r}.json").exists()}
    return code, reports


def test_failed_rank_exit_code_is_the_launchers(tmp_path, clean_env):
    code, reports = launch_here(tmp_path, "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    assert code == 3 and 1 in reports  # rank 0 may be stopped by torchrun before it reports, once rank 1 failed
    assert reports[1]["argv"][1:] == ["--local_rank=1", "--x", "1"]
    assert {k: reports[1]["env"][k] for k in ("LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")} == \
        {"LOCAL_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1"}  # DeepSpeed launch.py's extra variables


def test_killed_rank_fails_the_launcher(tmp_path, clean_env):
    code, _ = launch_here(tmp_path, "import signal\n"
                                    "if os.environ['RANK'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n")
    assert code == 128 + 9


def test_module_and_no_local_rank(tmp_path, clean_env):
    code, reports = launch_here(tmp_path, "", "--module", "--no_local_rank")
    assert code == 0
    assert [reports[r]["argv"][1:] for r in range(2)] == [["--x", "1"]] * 2
    assert reports[0]["argv"][0].endswith("job.py")
