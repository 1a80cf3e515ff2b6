"""Version checks of example scripts (transformers' ``utils/versions.py`` and ``utils.check_min_version``):
``require_version("datasets>=2.14.0")`` against the installed distribution, ``check_min_version`` against the
transformers release hf-lite mirrors."""

from __future__ import annotations

import importlib.metadata
import operator
import re

# The transformers release whose names, defaults and formats hf-lite mirrors (its tests run against it).
MIRRORED_TRANSFORMERS_VERSION = "5.24.0"

_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">=": operator.ge, ">": operator.gt}


def _key(version: str) -> tuple:
    """``"4.57.0.dev0"`` -> comparable tuple; a dev/rc/alpha/beta release sorts before the release itself."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)(.*)$", version)
    if match is None:
        raise ValueError(f"cannot parse version {version!r}")
    release = tuple(int(p) for p in match.group(1).split("."))
    release += (0,) * (4 - len(release))
    suffix = match.group(2).lstrip(".+-")
    return release + ((0,) if suffix and not suffix.startswith("post") else (1,))


def require_version(requirement: str, hint: str | None = None) -> None:
    """Raise ``ImportError`` unless the installed package satisfies ``requirement`` (``"pkg>=1.0,<2"``)."""
    hint = f"\n{hint}" if hint else ""
    match = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", requirement.strip())
    if match is None:
        raise ValueError(f"requirement {requirement!r} is not of the form pkg>=x.y")
    name, specs = match.group(1), match.group(2)
    if name == "python":
        import platform

        got = platform.python_version()
    else:
        try:
            got = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError as err:
            raise ImportError(f"The '{requirement}' distribution was not found and is required{hint}") from err
    for spec in filter(None, (s.strip() for s in specs.split(","))):
        op_match = re.match(r"^(<=|>=|==|!=|<|>)\s*(.+)$", spec)
        if op_match is None:
            raise ValueError(f"requirement {requirement!r}: cannot parse {spec!r}")
        op, want = op_match.groups()
        if not _OPS[op](_key(got), _key(want)):
            raise ImportError(f"{requirement} is required, found {name}=={got}{hint}")


def check_min_version(min_version: str) -> None:
    """An example script's ``check_min_version("4.57.0.dev0")``: passes when the transformers release hf-lite mirrors
    is at least that one, else raises naming both."""
    if _key(MIRRORED_TRANSFORMERS_VERSION) < _key(min_version):
        raise ImportError(
            f"This example requires transformers >= {min_version}; hf-lite mirrors {MIRRORED_TRANSFORMERS_VERSION}"
        )
