"""The resource pool: an MPI-style hostfile and the ``--include``/``--exclude`` filters over it.

DeepSpeed's ``deepspeed/launcher/runner.py`` (``fetch_hostfile``, ``parse_resource_filter``,
``parse_inclusion_exclusion``, ``apply_num_nodes_and_gpus``), same names and results, with
error messages that name the offending value. Every error is a ``ValueError``.
"""

from __future__ import annotations

import collections
import logging
import os
import re

logger = logging.getLogger(__name__)

# DeepSpeed's pattern: a host name, whitespace, "slots=" and digits; anything after is ignored.
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
NODE_SEP = "@"
SLOT_LIST_START = ":"
SLOT_SEP = ","


def fetch_hostfile(hostfile_path: str) -> collections.OrderedDict[str, int] | None:
    """``host -> slot count`` from the file, in file order; None when the file does not exist."""
    if not os.path.isfile(hostfile_path):
        logger.warning("Unable to find hostfile %s, will proceed with local resources only.", hostfile_path)
        return None
    with open(hostfile_path) as fd:
        return parse_hostfile(fd.readlines(), source=hostfile_path)


def parse_hostfile(lines: list[str], source: str = "hostfile") -> collections.OrderedDict[str, int]:
    """Lines ``host slots=N``; ``#`` comments and blank lines skipped; a host twice is an error."""
    pool: collections.OrderedDict[str, int] = collections.OrderedDict()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if line == "" or line.startswith("#"):
            continue
        match = _HOSTFILE_LINE.search(line)
        if match is None:
            raise ValueError(f"{source} line {number}: bad entry {line!r}, expected 'HOST slots=N'")
        host, slots = match.group(1), int(match.group(2))
        if host in pool:
            raise ValueError(f"{source} line {number}: host {host!r} appears more than once")
        pool[host] = slots
    if not pool:
        raise ValueError(f"{source} is empty: no 'HOST slots=N' line")
    return pool


def parse_node_config(node_config: str) -> tuple[str, list[int]]:
    """``NAME[:SLOT[,SLOT ...]]`` -> ``(NAME, [SLOT, ...])``; no slots means the whole node."""
    if SLOT_LIST_START not in node_config:
        return node_config, []
    hostname, _, slot_text = node_config.partition(SLOT_LIST_START)
    try:
        slots = [int(s) for s in slot_text.split(SLOT_SEP)]
    except ValueError:
        raise ValueError(f"bad slot list {slot_text!r} in {node_config!r}, expected NAME:SLOT[,SLOT ...]") from None
    return hostname, slots


def parse_node_config_list(node_config_list: str) -> dict[str, list[int]]:
    """``NODE_SPEC[@NODE_SPEC ...]`` -> ``{host: sorted unique slots}``; a host may repeat."""
    node_configs: dict[str, list[int]] = collections.defaultdict(list)
    for node_config in node_config_list.split(NODE_SEP):
        hostname, slots = parse_node_config(node_config)
        node_configs[hostname] += slots
    return {host: sorted(set(slots)) for host, slots in node_configs.items()}


def parse_resource_filter(host_info: dict[str, list[int]], include_str: str = "",
                          exclude_str: str = "") -> dict[str, list[int]]:
    """Keep only ``include_str``'s slots, or drop ``exclude_str``'s, from ``{host: [slot, ...]}``.

    Hosts that end up with no slot are dropped; the result keeps ``host_info``'s host order
    (the order ranks are numbered in).
    """
    if include_str and exclude_str:
        raise ValueError("--include and --exclude are mutually exclusive")
    if not include_str and not exclude_str:
        return host_info
    spec, including = (include_str, True) if include_str else (exclude_str, False)
    filtered = {} if including else {host: list(slots) for host, slots in host_info.items()}

    for hostname, slots in parse_node_config_list(spec).items():
        if hostname not in host_info:
            raise ValueError(f"Hostname {hostname!r} not found in hostfile (hosts: {', '.join(host_info)})")
        for slot in slots:
            if slot not in host_info[hostname]:
                raise ValueError(f"No slot {slot!r} on host {hostname!r} (slots: {host_info[hostname]})")
        if including:
            filtered[hostname] = slots if slots else host_info[hostname]
        elif slots:
            for slot in slots:
                logger.info("removing slot %d from %s", slot, hostname)
                filtered[hostname].remove(slot)
        else:
            filtered[hostname] = []

    ordered: dict[str, list[int]] = collections.OrderedDict()
    for host in host_info:
        slots = list(dict.fromkeys(filtered.get(host, [])))  # stable de-duplication
        if slots:
            ordered[host] = slots
    return ordered


def parse_inclusion_exclusion(resource_pool: dict[str, int], inclusion: str,
                              exclusion: str) -> dict[str, list[int]]:
    """Expand ``{host: slot count}`` to ``{host: [0, ..., n-1]}`` and apply the filter."""
    active = collections.OrderedDict((host, list(range(n))) for host, n in resource_pool.items())
    return parse_resource_filter(active, include_str=inclusion, exclude_str=exclusion)


def apply_num_nodes_and_gpus(active_resources: dict[str, list[int]], num_nodes: int,
                             num_gpus: int) -> dict[str, list[int]]:
    """The first ``num_nodes`` hosts, each given slots ``[0, num_gpus)``; values <= 0 leave that axis alone.

    As DeepSpeed's, ``num_gpus`` is not checked against the host's slot count: on a CPU host
    it is simply the number of processes.
    """
    if num_nodes > 0:
        active_resources = collections.OrderedDict(list(active_resources.items())[:num_nodes])
    if num_gpus > 0:
        active_resources = collections.OrderedDict((host, list(range(num_gpus))) for host in active_resources)
    return active_resources
