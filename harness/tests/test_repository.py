"""Repository-level guarantees: standalone packages, a valid workflow, README and CI in agreement."""

import ast
import re
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib
from harness.layers import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
WORKSPACE_IMPORTS = set(PACKAGES.values()) | {"harness"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("dist,mod", PACKAGES.items())
def test_package_never_imports_a_sibling(dist, mod):
    pkg = ROOT / "packages" / dist
    offenders = {}
    for path in [
        *pkg.joinpath("src").rglob("*.py"),
        *pkg.joinpath("tests").rglob("*.py"),
        *pkg.joinpath("benchmarks").rglob("*.py"),
    ]:
        bad = _imports(path) & (WORKSPACE_IMPORTS - {mod, "harness"})
        if path.is_relative_to(pkg / "src"):
            bad |= _imports(path) & {"harness"}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{dist} imports other miniframes packages: {offenders}"


@pytest.mark.slow
def test_each_wheel_installs_alone_and_imports(tmp_path):
    """Build every wheel, install it with --no-deps into a new venv that sees only third-party packages."""
    out = tmp_path / "dist"
    for dist in PACKAGES:
        subprocess.run(
            ["uv", "build", "--package", dist, "--wheel", "-o", str(out)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    for dist, mod in PACKAGES.items():
        wheel = next(out.glob(f"{mod}-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            meta = zf.read(f"{wheel.name.rsplit('-', 3)[0]}.dist-info/METADATA").decode()
            tops = {n.split("/")[0] for n in zf.namelist()}
        requires = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", meta, re.M)
        assert not set(requires) & (set(PACKAGES) | {"harness"}), (dist, requires)
        assert tops == {mod, wheel.name.rsplit("-", 3)[0] + ".dist-info"}, (dist, tops)
        py = _venv_seeing_third_party_only(tmp_path / f"venv-{mod}")
        subprocess.run(
            ["uv", "pip", "install", "--python", str(py), "--no-deps", "--offline", str(wheel)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        siblings = sorted(WORKSPACE_IMPORTS - {mod})
        code = (
            f"import {mod}, importlib.util\nprint({mod}.__file__)\n"
            f"found = [m for m in {siblings!r} if importlib.util.find_spec(m)]\nassert not found, found"
        )
        proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, f"import {mod} alone failed:\n{proc.stderr}"
        assert str(tmp_path) in proc.stdout


def test_packages_declare_what_they_import():
    """Every third-party module a package's source imports (at any depth, lazily too) comes from one of its declared
    dependencies or optional extras (paged-serve's server needs ``paged-serve[server]``), and so does
    ``Tensor.numpy()`` (torch does not depend on numpy). The wheel test above cannot see this: its venv sees every
    third-party package of the workspace."""

    def norm(name: str) -> str:
        return name.lower().replace("_", "-")

    providers = packages_distributions()
    missing = {}
    for dist, mod in PACKAGES.items():
        root = ROOT / "packages" / dist
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        extras = project.get("optional-dependencies", {}).values()
        deps = project["dependencies"] + [d for extra in extras for d in extra]
        declared = {norm(re.split(r"[<>=!~;\[ ]", d)[0]) for d in deps}
        for path in sorted((root / "src").rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            used = {
                "numpy"
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "numpy"
                and not node.args
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    used |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    used.add(node.module.split(".")[0])
            for name in used - set(sys.stdlib_module_names) - {mod}:
                if not {norm(d) for d in providers.get(name, [name])} & declared:
                    missing.setdefault(dist, set()).add(f"{name} ({path.relative_to(root)})")
    assert not missing, missing


def _venv_seeing_third_party_only(venv: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A path line (not a site dir) in a .pth: torch & co. resolve, while the workspace's editable
    # installs (themselves .pth files in that directory) are not processed, so siblings stay invisible.
    Path(site, "third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_workflow_is_valid_github_actions():
    wf = ROOT / ".github" / "workflows" / "ci.yml"
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(wf)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import yaml

    jobs = yaml.safe_load(wf.read_text())["jobs"]
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "linux", "gpu"]
    assert any(".ci/gpu" in step.get("run", "") for step in jobs["gpu"]["steps"])
    gpu_script = (ROOT / ".ci" / "gpu").read_text()
    assert "uv run pytest -m gpu" in gpu_script and "train-then-serve --device cuda" in gpu_script


def test_readme_shows_the_test_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    (command,) = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("uv run pytest")]
    assert command in (ROOT / "README.md").read_text()
    ci_yml = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert f"run: {command}" in ci_yml
