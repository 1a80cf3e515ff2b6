"""Each package's lines by layer, and the reading guides' file counts kept true (``uv run miniframes-lines``).

A module's layer follows from where it is, so the report, the import contracts and a reader agree:

- ``<import>/_compat/``: compatibility, what exists only so upstream code runs; it imports the core, never the
  reverse (each package's ``[tool.importlinter]`` contracts);
- ``<import>/_infra/``: infrastructure, the hardening the core calls at one point (stores, auth, failure
  detection, atomic I/O, ...);
- a facade, a module of imports, ``__all__`` and aliases only (every ``__init__.py``, and upstream import paths
  whose content lives in ``_compat``): counted as compatibility, since those names exist for upstream code;
- everything else: core, at the real framework's file names.

Lines are code lines: not blank, not comments, not docstrings (``code_lines``), so prose is not complexity.
The reading guides in the READMEs (sections headed "Reading guide", and the root README's "Learning path") name
each file as ``path`` (N), N its ``wc -l``; ``--write`` refreshes those counts and the line tables between
``<!-- miniframes-lines -->`` markers, ``--check`` fails when either is stale (``tests/test_layering.py``).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {
    "pt-dist": "pt_dist",
    "ds-zero": "ds_zero",
    "mega-par": "mega_par",
    "paged-serve": "paged_serve",
    "hf-lite": "hf_lite",
}
LAYERS = ("core", "compatibility", "infrastructure")
# the layering issue's targets, in code lines: a package's whole core, and the files one reading guide names
CORE_TARGET = {"pt_dist": 7000, "ds_zero": 3500, "mega_par": 3500, "paged_serve": 3500, "hf_lite": 3500}
GUIDE_TARGET = 800

BEGIN, END = "<!-- miniframes-lines -->", "<!-- /miniframes-lines -->"
# sections whose files are counted and checked: the packages' reading guides (each within GUIDE_TARGET) and the
# root README's learning path (a table of guides across packages: counts and core-ness checked, no total)
GUIDE_HEADING = re.compile(r"^(#+)\s.*(reading guide|learning path)", re.I)
HEADING = re.compile(r"^#+\s")
# a file a guide names: `path.py` (N)
GUIDE_FILE = re.compile(r"`([\w./-]+\.py)` \((\d+)\)")


def code_lines(source: str) -> int:
    """Lines holding code: blank lines, comments and docstrings (strings that start a statement) do not count."""
    lines, previous = set(), tokenize.NEWLINE
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in skip:
            if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                previous = tok.type
            continue
        starts_statement = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        previous = tok.type
        if tok.type == tokenize.STRING and starts_statement:
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def _names_only(node: ast.AST) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute, ast.Constant)) or (
        isinstance(node, (ast.List, ast.Tuple)) and all(_names_only(e) for e in node.elts))


def _facade_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True  # the docstring
    if isinstance(stmt, ast.Assign):
        return _names_only(stmt.value)  # __all__ = [...], an alias
    if isinstance(stmt, ast.AugAssign):
        return _names_only(stmt.value)  # __all__ += [...]
    if isinstance(stmt, ast.If) and ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
        return all(_facade_statement(s) for s in stmt.body + stmt.orelse)
    if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "__name__ == '__main__'" and not stmt.orelse:
        return all(_main_hook(s) for s in stmt.body)  # `python -m` on an upstream path
    return False


def _main_hook(stmt: ast.stmt) -> bool:
    """``main()``, ``sys.exit(main())`` or ``raise SystemExit(main())``: a call of a name, nothing computed."""
    call = stmt.value if isinstance(stmt, ast.Expr) else stmt.exc if isinstance(stmt, ast.Raise) else None
    if isinstance(call, ast.Call) and ast.unparse(call.func) in ("sys.exit", "SystemExit") and len(call.args) == 1:
        call = call.args[0]
    return isinstance(call, ast.Call) and not call.args and not call.keywords and _names_only(call.func)


def is_facade(source: str) -> bool:
    """A module of imports, ``__all__``, aliases and a docstring only (and a ``__main__`` hook that calls an
    imported ``main()``): it names things, it does nothing."""
    return all(_facade_statement(s) for s in ast.parse(source).body)


def import_root(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(module)
    return Path(list(spec.submodule_search_locations)[0])


def layer_of(root: Path, path: Path, source: str | None = None) -> str:
    parts = path.relative_to(root).parts
    if parts[0] == "_compat":
        return "compatibility"
    if parts[0] == "_infra":
        return "infrastructure"
    return "compatibility" if is_facade(source if source is not None else path.read_text()) else "core"


@dataclass
class PackageLines:
    dist: str
    module: str
    lines: dict = field(default_factory=lambda: dict.fromkeys((*LAYERS, "tests"), 0))
    files: dict = field(default_factory=dict)  # path relative to the import root's parent -> (layer, code lines)

    @property
    def core_target(self) -> int:
        return CORE_TARGET[self.module]


def package_lines(dist: str) -> PackageLines:
    module = PACKAGES[dist]
    root = import_root(module)
    out = PackageLines(dist, module)
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        kind, n = layer_of(root, path, source), code_lines(source)
        out.lines[kind] += n
        out.files[path.relative_to(root.parent).as_posix()] = (kind, n)
    tests = ROOT / "packages" / dist / "tests"
    out.lines["tests"] = sum(code_lines(p.read_text()) for p in tests.rglob("*.py"))
    return out


def markdown_table(reports: list[PackageLines]) -> str:
    rows = ["| package | core | compatibility | infrastructure | tests | core target |",
            "|---|---:|---:|---:|---:|---:|"]
    for r in reports:
        rows.append(f"| {r.dist} | {r.lines['core']:,} | {r.lines['compatibility']:,} | "
                    f"{r.lines['infrastructure']:,} | {r.lines['tests']:,} | {r.core_target:,} |")
    return "\n".join(rows)


# --- the reading guides ---------------------------------------------------------------------------------------


@dataclass
class Guide:
    readme: Path
    heading: str
    files: list  # (as written, resolved path or None, stated count)


def resolve(written: str, readme: Path) -> Path | None:
    """A path as a README writes it: ``src/pt_dist/x.py``, ``pt_dist/x.py``, or ``x.py`` from the package's
    import root when the README is a package's."""
    parts = Path(written).parts
    if parts[:1] == ("packages",):
        parts = parts[2:]
    if parts[:1] == ("src",):
        parts = parts[1:]
    if parts and parts[0] in PACKAGES.values():
        return import_root(parts[0]).parent.joinpath(*parts)
    dist = readme.parent.name
    if dist in PACKAGES:
        return import_root(PACKAGES[dist]).joinpath(*parts)
    return None


def guides(readme: Path) -> list[Guide]:
    out, current = [], None
    for line in readme.read_text().splitlines():
        if HEADING.match(line):
            current = Guide(readme, line.lstrip("# ").strip(), []) if GUIDE_HEADING.match(line) else None
            if current is not None:
                out.append(current)
            continue
        if current is not None:
            for written, stated in GUIDE_FILE.findall(line):
                current.files.append((written, resolve(written, readme), int(stated)))
    return out


def readmes() -> list[Path]:
    return [ROOT / "README.md", *(ROOT / "packages" / d / "README.md" for d in PACKAGES)]


def guide_problems(guide: Guide) -> list[str]:
    where = f"{guide.readme.relative_to(ROOT)} '{guide.heading}'"
    problems, total = [], 0
    if not guide.files:
        problems.append(f"{where}: names no file as `path.py` (N)")
    for written, path, stated in guide.files:
        if path is None or not path.is_file():
            problems.append(f"{where}: `{written}` is not a file of a package")
            continue
        source = path.read_text()
        kind = layer_of(package_root_of(path), path, source)
        if kind != "core":
            problems.append(f"{where}: `{written}` is {kind}, and a reading guide names core files only")
        actual = len(source.splitlines())
        if actual != stated:
            problems.append(f"{where}: `{written}` ({stated}) has {actual} lines (miniframes-lines --write)")
        total += code_lines(source)
    if total > GUIDE_TARGET and "learning path" not in guide.heading.lower():
        problems.append(f"{where}: its files hold {total} code lines, over the {GUIDE_TARGET} a guide may take")
    return problems


def package_root_of(path: Path) -> Path:
    for module in PACKAGES.values():
        root = import_root(module)
        if path.is_relative_to(root):
            return root
    raise ValueError(f"{path} is in no package")


def guide_total(guide: Guide) -> int:
    return sum(code_lines(p.read_text()) for _, p, _ in guide.files if p is not None and p.is_file())


# --- keeping the READMEs true ---------------------------------------------------------------------------------


def _table_for(readme: Path) -> str:
    dist = readme.parent.name
    names = [dist] if dist in PACKAGES else list(PACKAGES)
    return markdown_table([package_lines(d) for d in names])


def refreshed(readme: Path) -> str:
    """The README with its guide counts and its line table as they are now."""
    text = readme.read_text()
    lines, in_guide = [], False
    for line in text.splitlines(keepends=True):
        if HEADING.match(line):
            in_guide = bool(GUIDE_HEADING.match(line))
        elif in_guide:
            def count(m: re.Match) -> str:
                path = resolve(m.group(1), readme)
                if path is None or not path.is_file():
                    return m.group(0)
                return f"`{m.group(1)}` ({len(path.read_text().splitlines())})"
            line = GUIDE_FILE.sub(count, line)
        lines.append(line)
    text = "".join(lines)
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = f"{head}{BEGIN}\n{_table_for(readme)}\n{END}{tail}"
    return text


def check() -> list[str]:
    problems = []
    for readme in readmes():
        if refreshed(readme) != readme.read_text():
            problems.append(f"{readme.relative_to(ROOT)}: stale guide counts or line table (miniframes-lines --write)")
        if BEGIN not in readme.read_text():
            problems.append(f"{readme.relative_to(ROOT)}: no line table between {BEGIN} markers")
        for guide in guides(readme):
            problems += guide_problems(guide)
    for dist in PACKAGES:
        r = package_lines(dist)
        if r.lines["core"] > r.core_target:
            problems.append(f"{dist}: core {r.lines['core']} code lines, over its target {r.core_target}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miniframes-lines", description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", metavar="PACKAGE",
                        help=f"packages to report (default: all of {', '.join(PACKAGES)})")
    parser.add_argument("--files", action="store_true", help="list every module with its layer and code lines")
    parser.add_argument("--guides", action="store_true", help="list each reading guide's files and total")
    parser.add_argument("--write", action="store_true", help="refresh the READMEs' guide counts and line tables")
    parser.add_argument("--check", action="store_true", help="exit 1 if a README is stale or a target is missed")
    args = parser.parse_args(argv)
    unknown = [d for d in args.packages if d not in PACKAGES]
    if unknown:
        parser.error(f"unknown package(s) {unknown}: choose from {', '.join(PACKAGES)}")
    names = args.packages or list(PACKAGES)
    reports = [package_lines(d) for d in names]
    print(markdown_table(reports))
    if args.files:
        for r in reports:
            for path, (kind, n) in sorted(r.files.items(), key=lambda kv: (LAYERS.index(kv[1][0]), kv[0])):
                print(f"{kind:15} {n:6}  {path}")
    if args.guides:
        for readme in readmes():
            for guide in guides(readme):
                print(f"\n{readme.relative_to(ROOT)}: {guide.heading}: {guide_total(guide)} code lines")
                for written, _, stated in guide.files:
                    print(f"    {written} ({stated})")
    if args.write:
        for readme in readmes():
            new = refreshed(readme)
            if new != readme.read_text():
                readme.write_text(new)
                print(f"updated {readme.relative_to(ROOT)}")
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
