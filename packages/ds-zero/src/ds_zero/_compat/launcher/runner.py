"""The ``ds-zero`` command: DeepSpeed's ``deepspeed`` runner (``deepspeed/launcher/runner.py``).

``ds-zero [FLAGS] train.py --deepspeed_config ds.json`` reads DeepSpeed's flags, resolves the
resource pool (hostfile, ``--include``/``--exclude``, ``--num_nodes``/``--num_gpus``) into
``{host: [slot, ...]}`` and then either runs this node's ranks through torchrun (one node, or
``--no_ssh --node_rank N``) or, for several nodes, prints the torchrun command each node runs:
ds-zero never ssh'es. Bad input stops it with exit status 2 before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

from ds_zero._compat.launcher import hostfile as hf
from ds_zero._compat.launcher.launch import NodeLaunch, run_torchrun

logger = logging.getLogger("ds_zero.launcher")

DLTS_HOSTFILE = "/job/hostfile"  # DeepSpeed's default --hostfile
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
PDSH_LAUNCHER = "pdsh"
OTHER_LAUNCHERS = ("openmpi", "mvapich", "slurm", "mpich", "impi")
LOCAL_HOSTS = ("localhost", "127.0.0.1")

# DeepSpeed flags this launcher parses (so scripts that pass them get a clear answer) but does
# not implement: given a non-default value they stop the launcher, naming the flag.
REFUSED = {
    "launcher_args": ("--launcher_args", ""),
    "save_pid": ("--save_pid", False),
    "enable_each_rank_log": ("--enable_each_rank_log", "None"),
    "autotuning": ("--autotuning", ""),
    "bind_cores_to_rank": ("--bind_cores_to_rank", False),
    "bind_core_list": ("--bind_core_list", None),
    "ssh_port": ("--ssh_port", None),
    "venv_script": ("--venv_script", None),
}
NOT_IMPLEMENTED = "(not implemented by ds-zero: refused when given)"


def build_parser() -> argparse.ArgumentParser:
    """DeepSpeed's runner flags, same names, order and defaults (``None`` where DeepSpeed's -1 means unset)."""
    p = argparse.ArgumentParser(
        prog="ds-zero", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="ds-zero's launcher, DeepSpeed's `deepspeed` command: starts the training script's "
                    "ranks through torchrun with --local_rank=N; for several nodes it prints the command "
                    "each node runs (it never ssh'es).")
    p.add_argument("-H", "--hostfile", type=str, default=DLTS_HOSTFILE,
                   help="Hostfile (MPI style, lines 'worker-0 slots=4') defining the resource pool; "
                        "when the default is absent, local resources only")
    p.add_argument("-i", "--include", type=str, default="",
                   help="Resources to use: NODE_SPEC[@NODE_SPEC ...], NODE_SPEC=NAME[:SLOT[,SLOT ...]]; "
                        "e.g. 'worker-0@worker-1:0,2'")
    p.add_argument("-e", "--exclude", type=str, default="",
                   help="Resources NOT to use, same format as --include (mutually exclusive with it)")
    p.add_argument("--num_nodes", type=int, default=None,
                   help="Use the first N hosts of the hostfile")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=None,
                   help="Processes per node, slots [0, N); on a CPU host simply N processes. "
                        "Default: every slot (the CUDA device count, 1 without CUDA)")
    p.add_argument("--master_port", type=int, default=TORCH_DISTRIBUTED_DEFAULT_PORT,
                   help="Port of the rank-0 rendezvous")
    p.add_argument("--master_addr", type=str, default="",
                   help="Address of node 0; default 127.0.0.1 on one node, else the first host's name")
    p.add_argument("--node_rank", type=int, default=None,
                   help="This node's index in [0, nnodes) in the filtered host list; only with --no_ssh")
    p.add_argument("--launcher", type=str, default=PDSH_LAUNCHER,
                   help="Multi-node backend. Only 'pdsh' (the default) is accepted, and ds-zero does not run "
                        "it: it prints each node's torchrun command instead; "
                        f"{', '.join(OTHER_LAUNCHERS)} are refused")
    p.add_argument("--launcher_args", type=str, default="", help=f"Launcher-specific arguments {NOT_IMPLEMENTED}")
    p.add_argument("--module", action="store_true",
                   help="Run the script as a Python module, like 'python -m'")
    p.add_argument("--no_python", action="store_true",
                   help="Execute the script directly instead of with 'python'")
    p.add_argument("--no_local_rank", action="store_true",
                   help="Do not pass --local_rank=N to the script")
    p.add_argument("--no_ssh", action="store_true",
                   help="Run only this node's share of a multi-node job (needs --node_rank)")
    p.add_argument("--no_ssh_check", action="store_true",
                   help="Skip the ssh reachability check (ds-zero never ssh'es, so this is always the case)")
    p.add_argument("--force_multi", action="store_true",
                   help="Multi-node mode even for a single host: print its command instead of running it")
    p.add_argument("--save_pid", action="store_true", help=f"Write the launcher pid file {NOT_IMPLEMENTED}")
    p.add_argument("--enable_each_rank_log", type=str, default="None",
                   help=f"Per-rank log directory {NOT_IMPLEMENTED}")
    p.add_argument("--autotuning", type=str, default="", choices=["tune", "run"],
                   help=f"DeepSpeed autotuner {NOT_IMPLEMENTED}")
    p.add_argument("user_script", type=str, help="Training script, followed by its arguments")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    p.add_argument("--bind_cores_to_rank", action="store_true", help=f"numactl core binding {NOT_IMPLEMENTED}")
    p.add_argument("--bind_core_list", type=str, default=None, help=f"Cores to bind to {NOT_IMPLEMENTED}")
    p.add_argument("--ssh_port", type=int, default=None, help=f"ssh port {NOT_IMPLEMENTED}")
    p.add_argument("--venv_script", type=str, default=None, help=f"venv activation script {NOT_IMPLEMENTED}")
    p.add_argument("--log_level", type=str, default="info",
                   choices=["debug", "info", "warning", "error", "critical"], help="Launcher log level")
    p.add_argument("-q", "--quiet", action="store_true", help="Alias of --log_level error")
    return p


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what ds-zero does not implement or cannot mean; each error names the flag and value."""
    refused = [flag for dest, (flag, default) in REFUSED.items() if getattr(args, dest) != default]
    if refused:
        parser.error(f"not implemented by ds-zero: {', '.join(refused)}")
    launcher = args.launcher.lower()
    if launcher in OTHER_LAUNCHERS:
        parser.error(f"--launcher {args.launcher}: not implemented by ds-zero (it prints per-node torchrun "
                     f"commands instead; leave --launcher at {PDSH_LAUNCHER})")
    if launcher != PDSH_LAUNCHER:
        parser.error(f"--launcher {args.launcher}: unknown launcher")
    for flag in ("num_gpus", "num_nodes"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} {value}: must be at least 1")
    if (args.num_gpus is not None or args.num_nodes is not None) and (args.include or args.exclude):
        parser.error("--num_nodes/--num_gpus cannot be combined with --include/--exclude")
    if args.include and args.exclude:
        parser.error("--include and --exclude are mutually exclusive")
    if args.node_rank is not None and not args.no_ssh:
        parser.error(f"--node_rank {args.node_rank}: only used with --no_ssh")
    if args.no_ssh and args.node_rank is None:
        parser.error("--no_ssh needs --node_rank")
    if args.module and args.no_python:
        parser.error("--module and --no_python cannot be used together")
    if not (0 < args.master_port < 65536):
        parser.error(f"--master_port {args.master_port}: not a port number")
    if args.no_python:
        if shutil.which(args.user_script) is None:
            parser.error(f"training program not found or not executable: {args.user_script}")
    elif not args.module and not os.path.isfile(args.user_script):
        parser.error(f"training script not found: {args.user_script}")


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_slot_count() -> int:
    """The local resource pool without a hostfile: DeepSpeed asks its accelerator (its CPU accelerator
    counts NUMA nodes, usually 1); we count CUDA devices, or 1 on a host without them."""
    return _cuda_count() or 1


def resolve_resources(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict[str, list[int]], bool]:
    """``({host: [slot, ...]}, from_hostfile)`` after every filter, in rank order."""
    if args.hostfile != DLTS_HOSTFILE and not os.path.isfile(args.hostfile):
        parser.error(f"--hostfile {args.hostfile}: no such file")
    try:
        pool = hf.fetch_hostfile(args.hostfile) if os.path.isfile(args.hostfile) else None
    except ValueError as err:
        parser.error(str(err))

    if pool is None:
        if args.num_nodes is not None and args.num_nodes > 1:
            parser.error(f"--num_nodes {args.num_nodes}: no extra nodes without a --hostfile")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        filtered = bool(args.include or args.exclude or args.num_gpus or args.num_nodes)
        if visible and not filtered:
            # DeepSpeed turns CUDA_VISIBLE_DEVICES into --include=localhost:<ids>; we take the ids as the slots.
            try:
                slots = [int(s) for s in visible.split(",")]
            except ValueError:
                parser.error(f"CUDA_VISIBLE_DEVICES={visible}: expected comma-separated device ids")
            logger.info("Detected CUDA_VISIBLE_DEVICES=%s: setting --include=localhost:%s", visible, visible)
            active = {"localhost": slots}
        else:
            pool = {"localhost": local_slot_count()}
            if args.num_gpus and _cuda_count() and args.num_gpus > _cuda_count():
                logger.warning("--num_gpus %d: this host has %d CUDA devices (DeepSpeed does not check either)",
                               args.num_gpus, _cuda_count())
    if pool is not None:
        try:
            active = hf.parse_inclusion_exclusion(pool, args.include, args.exclude)
        except ValueError as err:
            flag = "--include" if args.include else "--exclude"
            parser.error(f"{flag} {args.include or args.exclude}: {err}")
    active = hf.apply_num_nodes_and_gpus(active, args.num_nodes or -1, args.num_gpus or -1)
    empty = [host for host, slots in active.items() if not slots]
    if empty or not active:
        parser.error(f"no slots to run on (hosts with slots=0: {', '.join(empty) or 'none'})")
    return active, os.path.isfile(args.hostfile)


def plan_nodes(args: argparse.Namespace, active: dict[str, list[int]], multi_node: bool) -> list[NodeLaunch]:
    """One :class:`NodeLaunch` per host, ranks numbered in host order as DeepSpeed's launch.py numbers them."""
    hosts = list(active)
    master_addr = args.master_addr
    if not master_addr:
        # DeepSpeed asks the first host for `hostname -I` over ssh; its name serves torchrun as well.
        master_addr = hosts[0] if multi_node or args.no_ssh else "127.0.0.1"
    world_size = sum(len(s) for s in active.values())
    nodes, first_rank = [], 0
    for node_rank, host in enumerate(hosts):
        nodes.append(NodeLaunch(host, node_rank, len(hosts), active[host], master_addr, args.master_port,
                                first_rank, world_size))
        first_rank += len(active[host])
    return nodes


def print_node_commands(nodes: list[NodeLaunch], torchrun_args: list[list[str]]) -> None:
    """The user-facing multi-node output: one command per node, to run on that node."""
    world = nodes[0].world_size
    print(f"ds-zero: {len(nodes)} node(s), {world} rank(s). ds-zero does not ssh/pdsh into the nodes: "
          "run each command below on its node (or `ds-zero --no_ssh --node_rank N ...` there).")
    if nodes[0].master_addr in LOCAL_HOSTS and len(nodes) > 1:
        print(f"ds-zero: warning: master address {nodes[0].master_addr} is a loopback address, which the other "
              "nodes cannot reach; pass --master_addr with node 0's address")
    cwd = os.getcwd()
    for node, targs in zip(nodes, torchrun_args):
        last = node.first_rank + node.nproc - 1
        print(f"# node {node.node_rank} of {node.nnodes}: {node.host}, ranks {node.first_rank}-{last}")
        print(node.shell_command(targs, cwd))


def configure_logging(args: argparse.Namespace) -> None:
    level = "error" if args.quiet else args.log_level
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[ds-zero launcher] %(levelname)s %(message)s"))
        logger.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args)
    check_args(parser, args)
    active, from_hostfile = resolve_resources(parser, args)
    multi_node = (args.force_multi or len(active) > 1) and not args.no_ssh
    if args.no_ssh and not (0 <= args.node_rank < len(active)):
        parser.error(f"--node_rank {args.node_rank}: must be in [0, {len(active)}) for hosts {', '.join(active)}")
    nodes = plan_nodes(args, active, multi_node)
    entry = dict(module=args.module, no_python=args.no_python, no_local_rank=args.no_local_rank)
    if multi_node:
        print_node_commands(nodes, [n.torchrun_args(args.user_script, args.user_args, **entry) for n in nodes])
        return 0
    node = nodes[args.node_rank if args.no_ssh else 0]
    if from_hostfile and node.host not in LOCAL_HOSTS and not args.no_ssh:
        logger.info("single host %s in the hostfile: running its ranks here, as DeepSpeed does", node.host)
    logger.info("launching %d rank(s) on %s (node %d of %d), world size %d", node.nproc, node.host,
                node.node_rank, node.nnodes, node.world_size)
    return run_torchrun(node, node.torchrun_args(args.user_script, args.user_args, local=True, **entry),
                        log_level=logger.level)


if __name__ == "__main__":
    sys.exit(main())
