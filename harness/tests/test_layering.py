"""Core, compatibility and infrastructure apart (harness/src/harness/layers.py): the rules a reader relies on,
checked on every package, each shown to fail on a planted counter-example."""

import ast
import subprocess

import pytest
import tomllib

from harness import layers

DISTS = list(layers.PACKAGES)


def test_facade_is_imports_and_names_only():
    assert layers.is_facade('"""doc"""\nfrom .a import b\nimport c as d\n__all__ = ["b"]\nalias = b\n')
    assert layers.is_facade("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import b\n")
    assert not layers.is_facade("from .a import b\ndef f():\n    return b\n")
    assert not layers.is_facade("from .a import b\nclass C(b):\n    pass\n")
    assert not layers.is_facade("from .a import b\nb.register('x')\n")
    assert not layers.is_facade("x = compute()\n")
    assert layers.is_facade("import sys\nfrom .cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    assert not layers.is_facade("from .cli import main\nif __name__ == '__main__':\n    main(parse())\n")


def test_code_lines_skip_docstrings_comments_and_blanks():
    source = '"""module\ndoc"""\n\n# a comment\ndef f(x):\n    """doc"""\n    return (x +\n            1)  # why\n'
    assert layers.code_lines(source) == 3


@pytest.mark.parametrize("dist", DISTS)
def test_init_modules_are_facades(dist):
    """A class or function in an ``__init__.py`` is found by nobody: every ``__init__`` only names things."""
    root = layers.import_root(layers.PACKAGES[dist])
    offenders = [str(p.relative_to(root.parent)) for p in root.rglob("__init__.py")
                 if not layers.is_facade(p.read_text())]
    assert not offenders, f"{dist}: __init__.py with code (move it to a module named after it): {offenders}"


def _imports_of(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield 0, a.name, []


def _absolute(root, path, level, module):
    if level == 0:
        return module
    package = path.relative_to(root.parent).with_suffix("").parts[:-1]  # a module's package, or an __init__'s own
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


@pytest.mark.parametrize("dist", DISTS)
def test_only_facades_and_compat_import_compat(dist):
    """The contract lint-imports checks, read straight off the source, so it holds even where the linter's
    configuration were loosened: a core or infrastructure module never imports ``_compat``."""
    module = layers.PACKAGES[dist]
    root = layers.import_root(module)
    offenders = []
    for path in root.rglob("*.py"):
        kind = layers.layer_of(root, path)
        if kind == "compatibility":
            continue
        for level, name, names in _imports_of(path):
            target = _absolute(root, path, level, name)
            hits = [target] if target.startswith(f"{module}._compat") else []
            hits += [f"{target}.{n}" for n in names if f"{target}.{n}".startswith(f"{module}._compat")]
            if hits:
                offenders.append(f"{path.relative_to(root.parent)} ({kind}) -> {hits}")
    assert not offenders, "\n".join(offenders)


def test_only_facades_and_compat_import_compat_catches_a_planted_import(tmp_path, monkeypatch):
    pkg = tmp_path / "pt_dist"
    (pkg / "_compat").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._compat.shim import x\n")
    (pkg / "_compat" / "__init__.py").write_text("")
    (pkg / "_compat" / "shim.py").write_text("x = 1\n")
    (pkg / "core.py").write_text("from ._compat import shim\n\ndef f():\n    return shim.x\n")
    monkeypatch.setitem(layers.PACKAGES, "pt-dist", "pt_dist")
    monkeypatch.setattr(layers, "import_root", lambda module: pkg)
    with pytest.raises(AssertionError, match="core.py"):
        test_only_facades_and_compat_import_compat("pt-dist")


def _module_file(module: str):
    root = layers.import_root(module.split(".")[0])
    path = root.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("dist", DISTS)
def test_contract_exceptions_are_facade_edges_into_compat_only(dist):
    """``ignore_imports`` may only excuse a facade re-exporting ``_compat``: nothing else is let through."""
    module = layers.PACKAGES[dist]
    pyproject = layers.ROOT / "packages" / dist / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    bad = []
    for contract in contracts:
        for edge in contract.get("ignore_imports", []):
            importer, imported = (x.strip() for x in edge.split("->"))
            if not imported.startswith(f"{module}._compat") or not layers.is_facade(_module_file(importer).read_text()):
                bad.append(f"{contract['name']}: {edge}")
    assert not bad, bad


def test_import_contracts_hold():
    """Each package's [tool.importlinter] (core never imports compatibility, infrastructure imports neither, no
    cycles) and the root's (packages never import each other), as .ci/run runs them."""
    configs = [str(layers.ROOT / "pyproject.toml")]
    for dist in DISTS:
        pyproject = layers.ROOT / "packages" / dist / "pyproject.toml"
        contracts = tomllib.loads(pyproject.read_text()).get("tool", {}).get("importlinter", {}).get("contracts", [])
        kinds = {c["type"] for c in contracts}
        assert {"layers", "acyclic_siblings"} <= kinds, f"{dist}: contracts {sorted(kinds)}"
        configs.append(str(pyproject))
    out = subprocess.run(["lint-imports", "--no-logo", "--no-cache", *configs], capture_output=True, text=True,
                         timeout=300, cwd=layers.ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_readmes_guides_and_targets_are_true():
    """Reading guides name core files only, with their current line counts, each guide within 800 code lines;
    the line tables are current; every package's core is within its target."""
    problems = layers.check()
    assert not problems, "\n".join(problems)


def _guide_in(tmp_path, readme, monkeypatch):
    """The one guide of a README written under ``tmp_path`` (as if it were the repository), and its problems."""
    monkeypatch.setattr(layers, "ROOT", tmp_path)
    (guide,) = layers.guides(readme)
    return guide, layers.guide_problems(guide)


def test_guide_check_catches_stale_counts_and_non_core_files(tmp_path, monkeypatch):
    readme = tmp_path / "pt-dist" / "README.md"
    readme.parent.mkdir()
    ring = layers.import_root("pt_dist") / "backends" / "ring.py"
    real = len(ring.read_text().splitlines())
    readme.write_text(f"# x\n## Reading guide: one op\n| `src/pt_dist/backends/ring.py` ({real + 1}) |\n"
                      "| `src/pt_dist/__init__.py` (1) |\n## After\n`src/pt_dist/backends/ring.py` (1)\n")
    guide, problems = _guide_in(tmp_path, readme, monkeypatch)
    assert any(f"({real + 1}) has {real} lines" in p for p in problems), problems
    assert any("__init__.py` is compatibility" in p for p in problems), problems
    assert len(guide.files) == 2  # the mention after the guide's section is not part of it


def test_the_root_learning_path_is_checked_like_a_guide_without_the_800_line_total(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    base = layers.import_root("pt_dist") / "backends" / "base.py"
    real = len(base.read_text().splitlines())
    rows = "".join(f"| `pt_dist/backends/base.py` ({real}) |\n" for _ in range(9))  # 9 x ~200 code lines
    readme.write_text(f"# x\n## Learning path (weeks)\n{rows}| `pt_dist/__init__.py` (1) |\n")
    guide, problems = _guide_in(tmp_path, readme, monkeypatch)
    assert len(guide.files) == 10
    assert problems == ["README.md 'Learning path (weeks)': `pt_dist/__init__.py` is compatibility, and a reading "
                        "guide names core files only", "README.md 'Learning path (weeks)': `pt_dist/__init__.py` (1) "
                        f"has {len(layers.import_root('pt_dist').joinpath('__init__.py').read_text().splitlines())} "
                        "lines (miniframes-lines --write)"], problems
